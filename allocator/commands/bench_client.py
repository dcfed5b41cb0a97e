"""``allocator bench``: the benchmark group, and ``allocator bench client``.

``bench`` is a plain click group that other modules extend (``@bench.command("claims")``
in their own module; ``allocator.commands`` registers the group once).

``allocator bench client`` measures :class:`allocator.client.IdClient` against a real pool.

Rules:

- Database: ``--database-url`` of a running allocator (a role granted
  ``allocator_consumer``; its leader must keep the pool stocked), or, without it, the
  embedded cluster in ``--state-dir`` (default ``.run/bench``: 1 ZooKeeper server, 1 node
  whose ``pool.min_blocks`` is ``--pool-blocks``), brought up here and stopped (by pid,
  through :class:`~allocator.local.cluster.LocalCluster`) at the end unless ``--keep``.
  Either way the run starts once ``allocator.pool_status`` shows ``--pool-blocks`` blocks
  (at most ``POOL_WAIT_S``); it claims as the ``allocator_app`` role.
- Throughput: for each ``--threads`` count, one shared client and that many threads
  calling ``next_id()`` in a tight loop for ``--seconds``; IDs/s over all threads.
- Latency: one thread times every ``next_id()`` with ``perf_counter_ns`` for ``--seconds``
  (exact histogram up to 100 µs, every slower call kept): p50/p99/p99.9/max, calls over
  1 ms, and the worst call that returned the first ID of a block (a block boundary) and of
  a claimed segment (the prefetch hand-over). The timer's own cost (reported as
  ``timer_overhead_ns``) is included in every sample. First the same loop times a no-op
  function for as long (``noise_floor``): what the machine alone (scheduling, other
  processes) does to a call, to read the client's worst calls against.
- ``waits`` counts calls that found nothing buffered (the prefetch was late or the pool
  ran dry): latency targets hold only "while the pool has blocks", so read them together.
- Every claimed ID that is not handed out is lost when a client closes (reported as
  ``unused_ids``); the bench claims several million IDs per second.
- Output: a table on stdout (``--json``: the JSON instead), the JSON written to
  ``--json-out`` (default ``<state-dir>/bench-client-<UTC time>.json``). Progress goes to
  stderr. Timings are reported, never judged; the machine's load is recorded with them.
"""

from __future__ import annotations

import json
import math
import os
import platform
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import click
import psycopg

from allocator import client as client_mod
from allocator import db
from allocator.client import Block, IdClient, PostgresClaimer
from allocator.commands import benchkit, options
from allocator.commands.ranges import FiniteFloatRange
from allocator.errors import AllocatorError, DatabaseUnavailableError

DEFAULT_STATE_DIR = Path(".run/bench")
DEFAULT_POOL_BLOCKS = 16_384
POOL_WAIT_S = 180.0
POOL_POLL_S = 0.5
CONSUMER = "bench-client"
CHUNK_CALLS = 4096
"""Calls between two clock reads in the loops (the clock is read outside the timed calls)."""
HISTOGRAM_LIMIT_NS = 100_000
SLOW_CALL_NS = 1_000_000
TOP_SLOWEST = 10

POOL_LEVEL: Final = "SELECT available_blocks FROM allocator.pool_status"


@click.group("bench")
def bench() -> None:
    """Benchmarks: each prints a table and writes JSON (timings are reported, never judged)."""


@dataclass
class ThroughputResult:
    threads: int
    ids: int
    seconds: float
    ids_per_s: float
    claims: int
    waits: int
    wait_timeouts: int
    unused_ids: int
    final_batch_blocks: int
    max_claim_ms: float
    errors: list[str] = field(default_factory=list)


@dataclass
class LatencyResult:
    calls: int
    p50_ns: int
    p99_ns: int
    p999_ns: int
    max_ns: int
    over_1ms: int
    block_boundaries: int
    boundary_max_ns: int
    segment_boundaries: int
    segment_boundary_max_ns: int
    slowest_ns: list[int]
    timer_overhead_ns: int
    waits: int
    claims: int
    unused_ids: int
    final_batch_blocks: int
    max_claim_ms: float
    noise_floor: dict[str, Any]
    """The same loop timing a no-op function: what the machine alone does to a call."""
    errors: list[str] = field(default_factory=list)
    claims_on_caller_thread: int = 0
    """Prefetches sent and collected on the timed thread (no claimer thread involved)."""
    claims_handed_over: int = 0
    """Prefetches whose answer came late: the claimer thread waited for them."""
    over_1ms_sending_prefetch: int = 0
    """Calls over 1 ms during which the client sent a prefetch claim (``begin``)."""
    over_1ms_collecting_prefetch: int = 0
    """Calls over 1 ms during which the client collected a prefetch's answer (``poll``)."""


class _RecordingClaimer:
    """Claims through PostgreSQL and remembers where every block and segment starts, so the
    latency loop can tell which calls crossed a boundary. A
    :class:`~allocator.client.NonBlockingClaimer` like the client's own, so the bench
    measures the prefetch the client makes on the caller's thread."""

    def __init__(self, url: str) -> None:
        self._inner = PostgresClaimer(url, application_name="allocator-bench-client")
        self.block_starts: set[int] = set()
        self.segment_starts: set[int] = set()
        self.block_sizes: set[int] = set()
        self.begun_at_ns: list[int] = []
        """``perf_counter_ns()`` of every prefetch sent from the calling thread."""
        self.collected_at_ns: list[int] = []
        """``perf_counter_ns()`` of every prefetch answer collected by a ``poll``."""

    def claim(self, consumer: str, n: int) -> list[Block]:
        return self._record(self._inner.claim(consumer, n))

    def begin(self, consumer: str, n: int) -> bool:
        self.begun_at_ns.append(time.perf_counter_ns())
        return self._inner.begin(consumer, n)

    def poll(self) -> list[Block] | None:
        blocks = self._inner.poll()
        if blocks is None:
            return None
        self.collected_at_ns.append(time.perf_counter_ns())
        return self._record(blocks)

    def finish(self, timeout_s: float | None = None) -> list[Block]:
        return self._record(self._inner.finish(timeout_s))

    def _record(self, blocks: list[Block]) -> list[Block]:
        if blocks:
            self.segment_starts.add(min(b.first_id for b in blocks))
            self.block_starts.update(b.first_id for b in blocks)
            self.block_sizes.update(b.size for b in blocks)
        return blocks

    def close(self) -> None:
        self._inner.close()


@bench.command("client")
@options.database_url_option(
    help="A running allocator's database (role granted allocator_consumer). "
    "[default: an embedded cluster in --state-dir]"
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_STATE_DIR,
    show_envvar=True,
    help="State folder of the embedded cluster (and of the JSON).",
)
@click.option(
    "--seconds",
    type=FiniteFloatRange(0.1, 600),
    default=5.0,
    show_envvar=True,
    help="Length of each run.",
)
@click.option(
    "--threads",
    default="1,4",
    show_envvar=True,
    help="Comma-separated thread counts, one throughput run each.",
)
@click.option(
    "--batch-blocks",
    type=click.IntRange(1, client_mod.MAX_BATCH_BLOCKS),
    default=64,
    show_envvar=True,
    help="Blocks per claim (the client's segment).",
)
@click.option(
    "--max-batch-blocks",
    type=click.IntRange(1, client_mod.MAX_BATCH_BLOCKS),
    default=256,
    show_envvar=True,
    help="Upper bound the client may grow its claims to when a prefetch comes too late.",
)
@click.option(
    "--refill-at",
    type=FiniteFloatRange(0.0, 1.0, min_open=True),
    default=client_mod.DEFAULT_REFILL_AT,
    show_envvar=True,
    help="Fraction of a segment left when the next one is claimed.",
)
@click.option(
    "--pool-blocks",
    type=click.IntRange(1, 100_000),
    default=DEFAULT_POOL_BLOCKS,
    show_envvar=True,
    help="Pool level to wait for before measuring (and the embedded node's pool.min_blocks).",
)
@click.option(
    "--json-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    show_envvar=True,
    help="Where to write the JSON. [default: <state-dir>/bench-client-<time>.json]",
)
@click.option(
    "--json", "as_json", is_flag=True, show_envvar=True, help="Print the JSON instead of the table."
)
@click.option("--keep", is_flag=True, show_envvar=True, help="Leave the embedded cluster running.")
def client(
    database_url: str | None,
    state_dir: Path,
    seconds: float,
    threads: str,
    batch_blocks: int,
    max_batch_blocks: int,
    refill_at: float,
    pool_blocks: int,
    json_out: Path | None,
    as_json: bool,
    keep: bool,
) -> None:
    """IDs/s of IdClient.next_id() on 1 and 4 threads, and its latency across block boundaries."""
    thread_counts = _parse_threads(threads)
    if max_batch_blocks < batch_blocks:
        raise click.BadParameter("must be >= --batch-blocks", param_hint="--max-batch-blocks")
    batch = (batch_blocks, max_batch_blocks)
    out = json_out or state_dir / f"bench-client-{benchkit.timestamp()}.json"
    signal.signal(signal.SIGTERM, benchkit.on_sigterm)
    try:
        with _database(database_url, state_dir, pool_blocks, keep) as (url, cluster_json):
            _wait_for_pool(url, pool_blocks)
            load_before = os.getloadavg()
            results = [
                _throughput(url, count, seconds, batch, refill_at) for count in thread_counts
            ]
            latency, block_sizes = _latency(url, seconds, batch, refill_at)
            load_after = os.getloadavg()
    except KeyboardInterrupt:
        benchkit.progress("interrupted")
        raise click.Abort from None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    document = {
        "database": "url" if database_url else "embedded",
        "cluster": cluster_json,
        "seconds": seconds,
        "batch_blocks": batch_blocks,
        "max_batch_blocks": max_batch_blocks,
        "refill_at": refill_at,
        "block_sizes": sorted(block_sizes),
        "results": [asdict(r) for r in results],
        "latency": asdict(latency),
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_before": list(load_before),
            "loadavg_after": list(load_after),
            "python": platform.python_version(),
            "switch_interval_s": sys.getswitchinterval(),
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(document, indent=2))
    else:
        for line in _table(document, results, latency):
            click.echo(line)
        click.echo(f"JSON written to {out}")
    benchkit.progress(f"JSON written to {out}")


def _parse_threads(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a list like 1,4", param_hint="--threads"
        ) from None
    if not counts or any(not 1 <= count <= 256 for count in counts):
        raise click.BadParameter("thread counts must be 1..256", param_hint="--threads")
    return counts


@contextmanager
def _database(
    url: str | None, state_dir: Path, pool_blocks: int, keep: bool
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The consumer URL to claim with: ``url``, or the embedded cluster's (one node, whose
    ``pool.min_blocks`` is ``pool_blocks``)."""
    if url:
        yield url, dict(benchkit.NOT_EMBEDDED)
        return
    node_env = {"ALLOCATOR_POOL_MIN_BLOCKS": str(pool_blocks)}
    with benchkit.embedded_cluster(state_dir, keep, nodes=1, node_env=node_env) as (info, data):
        yield info.consumer_database_url, data


def _wait_for_pool(url: str, blocks: int) -> None:
    benchkit.progress(f"waiting for {blocks} blocks in the pool")
    deadline = time.monotonic() + POOL_WAIT_S
    level = -1
    while True:
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
                while True:
                    row = conn.execute(POOL_LEVEL).fetchone()
                    level = int(row[0]) if row else 0
                    if level >= blocks:
                        benchkit.progress(f"pool holds {level} blocks")
                        return
                    if time.monotonic() > deadline:
                        break
                    time.sleep(POOL_POLL_S)
        except psycopg.OperationalError as exc:
            if time.monotonic() > deadline:
                raise DatabaseUnavailableError(
                    "read the pool level: PostgreSQL is unreachable"
                ) from exc
            time.sleep(POOL_POLL_S)
            continue
        except psycopg.Error as exc:
            raise db.translate(exc, "read the pool level") from exc
        raise AllocatorError(
            f"the pool holds {level} blocks after {POOL_WAIT_S:g} s, not {blocks}: "
            "is a leader cutting? (allocator status)"
        )


def _new_client(
    url: str, batch: tuple[int, int], refill_at: float
) -> tuple[IdClient, _RecordingClaimer]:
    claimer = _RecordingClaimer(url)
    id_client = IdClient(
        claimer,
        CONSUMER,
        batch_blocks=batch[0],
        max_batch_blocks=batch[1],
        refill_at=refill_at,
        wait_timeout_s=10.0,
    )
    id_client.start(wait=True)
    return id_client, claimer


def _throughput(
    url: str, threads: int, seconds: float, batch: tuple[int, int], refill_at: float
) -> ThroughputResult:
    benchkit.progress(f"throughput: {threads} thread(s) for {seconds:g} s")
    id_client, claimer = _new_client(url, batch, refill_at)
    counts = [0] * threads
    spans = [(0, 0)] * threads
    errors: list[str] = []
    barrier = threading.Barrier(threads + 1)
    stop_ns = [0]

    def spin(index: int) -> None:
        next_id = id_client.next_id
        clock = time.perf_counter_ns
        calls = 0
        barrier.wait()
        started = clock()
        try:
            while True:
                for _ in range(CHUNK_CALLS):
                    next_id()
                calls += CHUNK_CALLS
                if clock() >= stop_ns[0]:
                    break
        except AllocatorError as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        counts[index] = calls
        spans[index] = (started, clock())

    workers = [threading.Thread(target=spin, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    stop_ns[0] = time.perf_counter_ns() + int(seconds * 1e9)
    barrier.wait()
    for worker in workers:
        worker.join()
    stats = id_client.get_stats()
    report = id_client.close()
    claimer.close()
    elapsed_s = (max(end for _, end in spans) - min(start for start, _ in spans)) / 1e9
    total = sum(counts)
    return ThroughputResult(
        threads=threads,
        ids=total,
        seconds=round(elapsed_s, 3),
        ids_per_s=round(total / elapsed_s) if elapsed_s > 0 else 0,
        claims=stats["claims"],
        waits=stats["waits"],
        wait_timeouts=stats["wait_timeouts"],
        unused_ids=report.count,
        final_batch_blocks=stats["batch_blocks"],
        max_claim_ms=stats["max_claim_us"] / 1000,
        errors=errors,
    )


def _timer_overhead_ns() -> int:
    clock = time.perf_counter_ns
    samples = []
    for _ in range(10_001):
        t0 = clock()
        samples.append(clock() - t0)
    samples.sort()
    return samples[len(samples) // 2]


@dataclass
class _Samples:
    """Every timed call: exact below HISTOGRAM_LIMIT_NS, each slower one kept."""

    histogram: list[int] = field(default_factory=lambda: [0] * HISTOGRAM_LIMIT_NS)
    slow: list[int] = field(default_factory=list)
    boundary_ns: list[int] = field(default_factory=list)
    segment_ns: list[int] = field(default_factory=list)
    slow_spans: list[tuple[int, int]] = field(default_factory=list)
    """``(start_ns, took_ns)`` of every call over :data:`SLOW_CALL_NS`."""
    errors: list[str] = field(default_factory=list)

    def slow_containing(self, instants_ns: Sequence[int]) -> int:
        """How many calls over :data:`SLOW_CALL_NS` contain one of ``instants_ns``."""
        return sum(
            1
            for start, took in self.slow_spans
            if any(start <= at <= start + took for at in instants_ns)
        )

    @property
    def calls(self) -> int:
        return sum(self.histogram) + len(self.slow)

    def summary(self) -> dict[str, Any]:
        calls, histogram, slow = self.calls, self.histogram, sorted(self.slow)
        return {
            "calls": calls,
            "p50_ns": _percentile(histogram, slow, calls, 0.50),
            "p99_ns": _percentile(histogram, slow, calls, 0.99),
            "p999_ns": _percentile(histogram, slow, calls, 0.999),
            "max_ns": _percentile(histogram, slow, calls, 1.0),
            "over_1ms": sum(1 for took in slow if took > SLOW_CALL_NS),
            "slowest_ns": slow[-TOP_SLOWEST:][::-1],
        }


def _time_calls(
    call: Callable[[], int],
    seconds: float,
    block_starts: set[int] | frozenset[int] = frozenset(),
    segment_starts: set[int] | frozenset[int] = frozenset(),
) -> _Samples:
    """Time every ``call()`` for ``seconds``; note the calls that returned a block's or a
    segment's first ID (the sets fill up as the claimer claims)."""
    samples = _Samples()
    histogram, slow = samples.histogram, samples.slow
    clock = time.perf_counter_ns
    stop = clock() + int(seconds * 1e9)
    try:
        while clock() < stop:
            for _ in range(CHUNK_CALLS):
                t0 = clock()
                value = call()
                took = clock() - t0
                if took < HISTOGRAM_LIMIT_NS:
                    histogram[took] += 1
                else:
                    slow.append(took)
                    if took > SLOW_CALL_NS:
                        samples.slow_spans.append((t0, took))
                if value in block_starts:
                    samples.boundary_ns.append(took)
                    if value in segment_starts:
                        samples.segment_ns.append(took)
    except AllocatorError as exc:
        samples.errors.append(f"{type(exc).__name__}: {exc}")
    return samples


def _no_op() -> int:
    return -1


def _latency(
    url: str, seconds: float, batch: tuple[int, int], refill_at: float
) -> tuple[LatencyResult, set[int]]:
    benchkit.progress(f"noise floor: a no-op timed the same way for {seconds:g} s")
    floor = _time_calls(_no_op, seconds).summary()
    benchkit.progress(f"latency: 1 thread, every next_id() timed, for {seconds:g} s")
    id_client, claimer = _new_client(url, batch, refill_at)
    samples = _time_calls(id_client.next_id, seconds, claimer.block_starts, claimer.segment_starts)
    stats = id_client.get_stats()
    report = id_client.close()
    claimer.close()
    summary = samples.summary()
    result = LatencyResult(
        calls=summary["calls"],
        p50_ns=summary["p50_ns"],
        p99_ns=summary["p99_ns"],
        p999_ns=summary["p999_ns"],
        max_ns=summary["max_ns"],
        over_1ms=summary["over_1ms"],
        block_boundaries=len(samples.boundary_ns),
        boundary_max_ns=max(samples.boundary_ns, default=0),
        segment_boundaries=len(samples.segment_ns),
        segment_boundary_max_ns=max(samples.segment_ns, default=0),
        slowest_ns=summary["slowest_ns"],
        timer_overhead_ns=_timer_overhead_ns(),
        waits=stats["waits"],
        claims=stats["claims"],
        unused_ids=report.count,
        final_batch_blocks=stats["batch_blocks"],
        max_claim_ms=stats["max_claim_us"] / 1000,
        noise_floor=floor,
        errors=samples.errors,
        claims_on_caller_thread=stats["claims_on_caller_thread"],
        claims_handed_over=stats["claims_handed_over"],
        over_1ms_sending_prefetch=samples.slow_containing(claimer.begun_at_ns),
        over_1ms_collecting_prefetch=samples.slow_containing(claimer.collected_at_ns),
    )
    return result, claimer.block_sizes


def _percentile(histogram: list[int], slow: list[int], calls: int, q: float) -> int:
    """The smallest sample with at least ``q`` of all samples at or below it."""
    if calls == 0:
        return 0
    rank = max(1, min(calls, math.ceil(q * calls)))
    seen = 0
    for took, count in enumerate(histogram):
        seen += count
        if seen >= rank:
            return took
    return slow[rank - seen - 1]  # ``slow`` sorted


def _table(
    document: dict[str, Any], results: list[ThroughputResult], latency: LatencyResult
) -> Iterator[str]:
    sizes = "/".join(str(size) for size in document["block_sizes"]) or "?"
    load = document["machine"]["loadavg_before"][0]
    yield (
        f"allocator bench client: {document['seconds']:g} s per run, {document['batch_blocks']} "
        f"blocks x {sizes} IDs per claim, refill at {document['refill_at']:g}, "
        f"{document['machine']['cpus']} CPUs, load {load:.2f}"
    )
    yield ""
    yield (
        f"{'threads':>7}  {'IDs':>12}  {'IDs/s':>12}  {'claims':>6}  {'waits':>5}  "
        f"{'batch':>5}  {'max claim':>9}  errors"
    )
    for r in results:
        yield (
            f"{r.threads:>7}  {r.ids:>12,}  {r.ids_per_s:>12,.0f}  {r.claims:>6}  "
            f"{r.waits:>5}  {r.final_batch_blocks:>5}  {r.max_claim_ms:>6.1f} ms  {len(r.errors)}"
        )
    yield ""
    lat = latency
    yield (
        f"next_id() latency, 1 thread, {lat.calls:,} calls timed "
        f"(timer overhead ~{lat.timer_overhead_ns} ns included)"
    )
    yield (
        f"  p50 {lat.p50_ns:,} ns   p99 {lat.p99_ns:,} ns   p99.9 {lat.p999_ns:,} ns   "
        f"max {lat.max_ns:,} ns"
    )
    yield (
        f"  calls over 1 ms: {lat.over_1ms} ({lat.over_1ms_sending_prefetch} sent a prefetch, "
        f"{lat.over_1ms_collecting_prefetch} collected one)   waits (nothing buffered): "
        f"{lat.waits}   "
        f"claims: {lat.claims} (max {lat.max_claim_ms:.1f} ms, final batch "
        f"{lat.final_batch_blocks} blocks)"
    )
    yield (
        f"  prefetches on the calling thread: {lat.claims_on_caller_thread}   handed over to "
        f"the claimer thread: {lat.claims_handed_over}"
    )
    yield (
        f"  worst at a block boundary: {lat.boundary_max_ns:,} ns "
        f"({lat.block_boundaries} boundaries); at a segment hand-over: "
        f"{lat.segment_boundary_max_ns:,} ns "
        f"({lat.segment_boundaries} segments)"
    )
    yield "  slowest calls (ns): " + ", ".join(f"{took:,}" for took in lat.slowest_ns[:5])
    floor = lat.noise_floor
    yield (
        f"noise floor (a no-op timed the same way, {floor['calls']:,} calls): "
        f"p99.9 {floor['p999_ns']:,} ns   max {floor['max_ns']:,} ns   "
        f"calls over 1 ms: {floor['over_1ms']}"
    )

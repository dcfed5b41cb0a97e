"""``allocator bench client``: :class:`allocator.client.IdClient` against a real pool.

Throughput (threads sharing one client) and latency (one thread timing every ``next_id()``),
on a running allocator's pool or the embedded cluster's (docs/design.md §9).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import psycopg

from allocator.bench import kit
from allocator.bench.client import report
from allocator.bench.client.claimer import RecordingClaimer
from allocator.bench.client.results import LatencyResult, ThroughputResult
from allocator.bench.client.timing import CHUNK_CALLS, no_op, time_calls, timer_overhead_ns
from allocator.client import IdClient
from allocator.core.errors import AllocatorError, DatabaseLoginError, DatabaseUnavailableError
from allocator.postgres.errors import translate

DEFAULT_POOL_BLOCKS = 16_384
POOL_WAIT_S = 180.0
POOL_POLL_S = 0.5
CONSUMER = "bench-client"

POOL_LEVEL: Final = "SELECT available_blocks FROM allocator.pool_status"


@contextmanager
def database(
    url: str | None, state_dir: Path, pool_blocks: int, keep: bool
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The consumer URL to claim with: ``url`` (a role granted ``allocator_consumer``; its
    leader must keep the pool stocked), or the embedded cluster's in ``state_dir`` (1
    ZooKeeper server, 1 node whose ``pool.min_blocks`` is ``pool_blocks``; claims as
    ``allocator_app``), brought up and stopped by pid by :mod:`allocator.bench.kit` unless
    ``keep``."""
    if url:
        yield url, dict(kit.NOT_EMBEDDED)
        return
    node_env = {"ALLOCATOR_POOL_MIN_BLOCKS": str(pool_blocks)}
    with kit.embedded_cluster(state_dir, keep, nodes=1, node_env=node_env) as (info, data):
        yield info.consumer_database_url, data


def wait_for_pool(url: str, blocks: int) -> None:
    """Returns once ``allocator.pool_status`` shows ``blocks`` blocks (at most
    :data:`POOL_WAIT_S`); a login error raises at once, no retry can help."""
    kit.progress(f"waiting for {blocks} blocks in the pool")
    deadline = time.monotonic() + POOL_WAIT_S
    level = -1
    while True:
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
                while True:
                    row = conn.execute(POOL_LEVEL).fetchone()
                    level = int(row[0]) if row else 0
                    if level >= blocks:
                        kit.progress(f"pool holds {level} blocks")
                        return
                    if time.monotonic() > deadline:
                        break
                    time.sleep(POOL_POLL_S)
        except psycopg.OperationalError as exc:
            found = translate(exc, "read the pool level")
            if isinstance(found, DatabaseLoginError):  # no retry can help: exit 78 at once
                raise found from exc
            if time.monotonic() > deadline:
                raise DatabaseUnavailableError(
                    "read the pool level: PostgreSQL is unreachable"
                ) from exc
            time.sleep(POOL_POLL_S)
            continue
        except psycopg.Error as exc:
            raise translate(exc, "read the pool level") from exc
        raise AllocatorError(
            f"the pool holds {level} blocks after {POOL_WAIT_S:g} s, not {blocks}: "
            "is a leader cutting? (allocator status)"
        )


def new_client(
    url: str, batch: tuple[int, int], refill_at: float
) -> tuple[IdClient, RecordingClaimer]:
    """A started client whose claims are recorded (block and segment boundaries)."""
    claimer = RecordingClaimer(url)
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


def throughput(
    url: str, threads: int, seconds: float, batch: tuple[int, int], refill_at: float
) -> ThroughputResult:
    """One shared client and ``threads`` threads calling ``next_id()`` in a tight loop for
    ``seconds``; IDs/s over all threads. ``waits`` counts calls that found nothing buffered
    (the prefetch was late or the pool ran dry); IDs claimed but not handed out are lost at
    close (``unused_ids``)."""
    kit.progress(f"throughput: {threads} thread(s) for {seconds:g} s")
    id_client, claimer = new_client(url, batch, refill_at)
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


def latency(
    url: str, seconds: float, batch: tuple[int, int], refill_at: float
) -> tuple[LatencyResult, set[int]]:
    """One thread times every ``next_id()``: p50/p99/p99.9/max, calls over 1 ms, and the worst
    call that returned a block's first ID or a claimed segment's (the prefetch hand-over).

    First the same loop times a no-op for as long (``noise_floor``): what the machine alone
    does to a call. Latency targets hold only "while the pool has blocks": read them with
    ``waits``."""
    kit.progress(f"noise floor: a no-op timed the same way for {seconds:g} s")
    floor = time_calls(no_op, seconds).summary()
    kit.progress(f"latency: 1 thread, every next_id() timed, for {seconds:g} s")
    id_client, claimer = new_client(url, batch, refill_at)
    samples = time_calls(id_client.next_id, seconds, claimer.block_starts, claimer.segment_starts)
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
        timer_overhead_ns=timer_overhead_ns(),
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


def run(
    database_url: str | None,
    state_dir: Path,
    keep: bool,
    *,
    seconds: float,
    thread_counts: list[int],
    batch: tuple[int, int],
    refill_at: float,
    pool_blocks: int,
) -> tuple[dict[str, Any], list[ThroughputResult], LatencyResult]:
    """The bench as ``allocator bench client`` runs it: the JSON document, the throughput
    runs and the latency run."""
    with database(database_url, state_dir, pool_blocks, keep) as (url, cluster_json):
        wait_for_pool(url, pool_blocks)
        load_before = os.getloadavg()
        results = [throughput(url, count, seconds, batch, refill_at) for count in thread_counts]
        latency_result, block_sizes = latency(url, seconds, batch, refill_at)
        load_after = os.getloadavg()
    document = report.document(
        results,
        latency_result,
        database="url" if database_url else "embedded",
        cluster=cluster_json,
        seconds=seconds,
        batch=batch,
        refill_at=refill_at,
        block_sizes=block_sizes,
        machine=kit.machine(load_before, load_after, switch_interval_s=sys.getswitchinterval()),
    )
    return document, results, latency_result

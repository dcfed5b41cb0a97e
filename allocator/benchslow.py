"""``allocator bench slow-consumer``: what one claim left open costs everyone else.

A consumer runs ``BEGIN; SELECT allocator.claim_blocks(…)`` and then sits idle, holding its
block's row lock, while other consumers keep claiming and the leader keeps refilling. Do
``pool_status``, ``requeue_stranded`` and the claim itself cost as much after many claims
as at the start? Migration 0004 says yes (held tickets); the 0003 functions, whose requeue
floor stops below the open claim, are measured the same way for comparison.

Rules:

- One PostgreSQL server (the embedded cluster, or a superuser URL). Each run works in a
  database of its own (:data:`RUN_DB`), created, migrated to the revision under test
  (``head``, or ``0003`` through Alembic), stocked with ``pool_blocks`` blocks through
  ``cut_blocks``, ``VACUUM ANALYZE``-d (so the planner knows the one-row tables, as it does
  in a database that has been running), and dropped afterwards. Never the allocator's own
  database.
- Warm-up: ``warmup`` claims (default: twice ``pool_blocks``) with the leader ticking, not
  measured, so the pool both windows meet was cut during the run, like a live pool (the
  stock cut at setup was vacuumed, and reads faster). Then the held claim, made as the
  consumer role in a transaction kept open to the end. ``claim_blocks`` (0004) bounds that
  transaction's idle time to 60 s; the bench lifts the bound for the experiment with
  ``SET LOCAL idle_in_transaction_session_timeout = 0``, issued after the claim inside the
  same transaction: it overrides the function's transaction-local setting, and the server
  reads the setting each time the session goes idle. At the end the leader runs twice more
  (the second run considers every ticket drawn) and the bench reads what it recorded of
  the open claim, checks the holder is still alive, rolls it back, runs
  ``requeue_stranded`` as the leader would (up to :data:`REQUEUE_RUNS_AFTER_ROLLBACK`
  times) until the block has a fresh ticket after the claim position, and claims the pool
  dry to see the block handed out again.
- Claims: pgbench, the bundled ``claim_blocks.pgbench`` (one block per claim) as the
  consumer role, ``-n -M prepared -c C -j min(C, 2) -R rate -t claims/C -l``. A claim's
  latency is its logged time minus its schedule lag: its own execution time, whatever the
  rate limiter's queue did. The rate is fixed so the first and the last claims run under
  the same load.
- Leader: a thread that does what the refill job does, once per ``requeue_every`` claims'
  worth of time: ``requeue_stranded`` (the statement timed; its COMMIT, a WAL flush that
  shares the disk with every claim, timed apart as ``requeue_commit``, reported but not
  judged), then read the pool level and cut it back up to ``pool_blocks`` (not timed), on
  a superuser connection with the bench's fence token. The default, every 100 claims, is
  20 runs a second at the default rate: 20 times the refill job's pace, for enough samples
  per window.
- Reader: a monitoring consumer, a thread reading ``SELECT * FROM allocator.pool_status``
  (timed) every ``status_every_ms``. Both threads skip ahead when a tick overruns (no burst
  to catch up).
- Windows: the first and the last ``window`` claims by completion time; a leader or reader
  sample belongs to a window when it started within that window's span of time. p50/p99
  are nearest-rank; ratios are last over first.
- What an open transaction costs that no schema avoids: it holds back the horizon below
  which dead row versions may be removed, so the one-row ``high_water`` keeps a version per
  leader write (each requeue that changed it, each cut) and every read of it walks them.
  That grows with leader writes during the hold, not with claims; the bench reports the
  table's size at the end (``high_water_pages``) so it can be told apart.
- Also reported: a profile (p50/p99 of each measure over each tenth of the claims), to see
  how costs move along the whole run, and the machine's mean load average during each
  window (the bench shares its machine; a late burst of load shows there, not as a cost of
  the functions).
- Timings are reported, never judged: the target (:data:`TARGET_P99_RATIO`) is printed
  next to them. A run whose pool ran dry (a client aborted on AL003) is flagged.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psycopg
from alembic import command
from psycopg import sql
from psycopg.rows import dict_row
from sqlalchemy.exc import SQLAlchemyError

from allocator import benchclaims, migrate
from allocator.benchclaims import BenchError, Server
from allocator.config import process_environment

RUN_DB = "bench_slow_consumer_run"
EPOCH = benchclaims.EPOCH
BLOCK_SIZE_IDS = benchclaims.BLOCK_SIZE_IDS
HEAD = "head"
OLD_REVISION = "0003"
"""The functions before held tickets: the requeue floor stops below an open claim."""
TARGET_P99_RATIO = 1.5
REQUEUE_RUNS_AFTER_ROLLBACK = 3
HELD_CONSUMER = "bench-slow-consumer"
PGBENCH_GRACE_S = 120.0
STOCK_BATCH_BLOCKS = 50_000
MEASURES: Final = ("pool_status", "requeue_stranded", "claim")
"""What the bench judges against the target."""
REPORTED: Final = (*MEASURES, "requeue_commit")
PROFILE_BUCKETS = 10

POOL_STATUS: Final = "SELECT * FROM allocator.pool_status"
POOL_LEVEL: Final = "SELECT available_blocks FROM allocator.pool_status"
REQUEUE: Final = "SELECT allocator.requeue_stranded(0, %s)"
CUT: Final = "SELECT * FROM allocator.cut_blocks(0, %s, %s, %s, %s, 1000)"
FLOOR: Final = "SELECT requeued_upto, requeue_mark FROM allocator.high_water"
POSITION: Final = (
    "SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END FROM allocator.claim_ticket s"
)
HAS_HELD_TICKETS: Final = "SELECT to_regclass('allocator.held_tickets') IS NOT NULL"
HIGH_WATER_PAGES: Final = (
    "SELECT pg_relation_size('allocator.high_water') / current_setting('block_size')::int"
)


@dataclass(frozen=True)
class Plan:
    claims: int = 200_000
    window: int = 10_000
    rate: int = 2_000
    """Claims per second, all clients together (pgbench ``-R``)."""
    clients: int = 4
    requeue_every: int = 100
    """Claims between two leader ticks (requeue_stranded, then the refill)."""
    status_every_ms: int = 20
    """Milliseconds between two reads of pool_status by the monitoring reader."""
    pool_blocks: int = 5_000
    warmup: int | None = None
    """Claims before the held claim (None: twice ``pool_blocks``), so both windows meet a
    pool of blocks the leader cut during the run, not the stock vacuumed at setup."""
    revisions: tuple[str, ...] = (HEAD, OLD_REVISION)

    def warmup_claims(self) -> int:
        return 2 * self.pool_blocks if self.warmup is None else self.warmup

    def per_client(self) -> int:
        return math.ceil(self.claims / self.clients)

    def total_claims(self) -> int:
        return self.per_client() * self.clients

    def window_claims(self) -> int:
        """At most half the claims, so the first and last windows never overlap."""
        return max(1, min(self.window, self.total_claims() // 2))

    def tick_s(self) -> float:
        return self.requeue_every / self.rate


@dataclass(frozen=True)
class Window:
    samples: int
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True)
class Measure:
    first: Window
    last: Window
    p50_ratio: float | None
    p99_ratio: float | None

    @classmethod
    def of(cls, first_us: list[int], last_us: list[int]) -> Measure:
        first, last = _window(first_us), _window(last_us)
        return cls(
            first=first,
            last=last,
            p50_ratio=_ratio(last.p50_ms, first.p50_ms),
            p99_ratio=_ratio(last.p99_ms, first.p99_ms),
        )


@dataclass
class RunResult:
    functions: str
    """The schema revision the run measured (``0004`` = held tickets, ``0003`` = before)."""
    claims: int
    window_claims: int
    seconds: float
    claims_per_s: float
    leader_ticks: int
    blocks_cut: int
    blocks_requeued: int
    pool_ran_dry: bool
    measures: dict[str, Measure]
    held: dict[str, Any] = field(default_factory=dict)
    """The open claim: block, whether it survived the run, what the leader saw of it at the
    end, and whether it came back to the pool after its rollback."""
    load: dict[str, float | None] = field(default_factory=dict)
    """Mean 1-minute load average of the machine during the first and the last window."""
    profile: list[dict[str, Any]] = field(default_factory=list)
    """p50/p99 of each measure over each tenth of the claims, in order."""


@dataclass(frozen=True)
class Sample:
    """One timed statement of a ticking thread."""

    started: float
    """Wall-clock time (``time.time()``) it started: pgbench logs wall-clock times."""
    took_us: int
    load1: float
    """The machine's 1-minute load average then (the bench shares the machine)."""


@dataclass(frozen=True)
class Claim:
    ended: float
    exec_us: int


# --- the leader and the reader ---------------------------------------------------------


class Ticker(threading.Thread):
    """Runs :meth:`tick` every ``interval_s`` on a connection of its own until stopped; a
    tick that overruns starts the next one at once (never a burst to catch up). An error
    ends the thread and is kept in :attr:`error` for the main thread to raise."""

    def __init__(self, name: str, url: str, interval_s: float) -> None:
        super().__init__(name=name, daemon=True)
        self._url = url
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self.samples: list[Sample] = []
        self.error: BaseException | None = None

    def stop(self) -> None:
        """Stop and wait for the thread (if it ever started); again is harmless."""
        self._stopped.set()
        if self.ident is not None:
            self.join()

    def run(self) -> None:
        try:
            with psycopg.connect(self._url, autocommit=True) as conn:
                due = time.monotonic()
                while not self._stopped.is_set():
                    self.tick(conn)
                    due += self._interval_s
                    now = time.monotonic()
                    due = max(due, now)
                    self._stopped.wait(due - now)
        except BaseException as exc:  # handed to the main thread, which raises it
            self.error = exc

    def tick(self, conn: psycopg.Connection[Any]) -> None:
        raise NotImplementedError

    def timed(self, conn: psycopg.Connection[Any], query: str, *args: Any) -> list[Any]:
        """Run ``query``, record how long it took (the round trip a caller sees)."""
        started = time.time()
        t0 = time.perf_counter_ns()
        with conn.cursor(row_factory=dict_row) as cursor:
            rows = cursor.execute(query, *args).fetchall()
        took = time.perf_counter_ns() - t0
        self.samples.append(Sample(started, took // 1000, os.getloadavg()[0]))
        return rows


class Leader(Ticker):
    """What the refill job does in the database, on the bench's tick: ``requeue_stranded``
    (timed), then the pool level and a cut back up to ``pool_blocks`` (not timed)."""

    def __init__(self, url: str, plan: Plan, next_block: int) -> None:
        super().__init__("bench-leader", url, plan.tick_s())
        self._pool_blocks = plan.pool_blocks
        self._next_block = next_block
        self.blocks_cut = 0
        self.moved = 0
        self.commits: list[Sample] = []
        """The requeue's COMMIT, timed apart: a WAL flush, the disk's cost, not the
        function's (it shares the disk with every claim's commit)."""

    def tick(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            (row,) = self.timed(conn, REQUEUE, (EPOCH,))
            started, t0 = time.time(), time.perf_counter_ns()
        took = time.perf_counter_ns() - t0
        self.commits.append(Sample(started, took // 1000, os.getloadavg()[0]))
        self.moved += int(next(iter(row.values())))
        level = conn.execute(POOL_LEVEL).fetchone()
        if (need := self._pool_blocks - (int(level[0]) if level else 0)) > 0:
            self._next_block = cut_blocks(conn, self._next_block, need)
            self.blocks_cut += need


class Reader(Ticker):
    """A monitoring consumer: ``SELECT * FROM allocator.pool_status`` (timed) on a tick."""

    def __init__(self, url: str, plan: Plan) -> None:
        super().__init__("bench-pool-status", url, plan.status_every_ms / 1000)

    def tick(self, conn: psycopg.Connection[Any]) -> None:
        self.timed(conn, POOL_STATUS)


def cut_blocks(conn: psycopg.Connection[Any], start: int, count: int) -> int:
    """Cut blocks ``start … start + count - 1`` (cutting order) as the leader; the next index."""
    for offset in range(0, count, STOCK_BATCH_BLOCKS):
        ranges = [
            benchclaims.BENCH_LAYOUT.nth_block(start + offset + k, BLOCK_SIZE_IDS)
            for k in range(min(STOCK_BATCH_BLOCKS, count - offset))
        ]
        conn.execute(
            CUT,
            (
                EPOCH,
                [first for first, _ in ranges],
                [last for _, last in ranges],
                benchclaims.LAYOUT_JSON,
            ),
        )
    return start + count


# --- one run ---------------------------------------------------------------------------


@contextmanager
def run_database(server: Server, revision: str, plan: Plan) -> Iterator[str]:
    """:data:`RUN_DB` at ``revision``, fenced and stocked with ``plan.pool_blocks``."""
    benchclaims.drop_database(server, RUN_DB)
    with psycopg.connect(server.url("postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(RUN_DB)))
    try:
        url = server.url(RUN_DB)
        if revision == HEAD:
            migrate.upgrade_to_head(url)
        else:
            try:
                command.upgrade(migrate._alembic_config(url), revision)
            except SQLAlchemyError as exc:
                raise BenchError(f"cannot migrate {RUN_DB} to {revision}: {exc}") from exc
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "SELECT * FROM allocator.take_fence(0, %s, 'bench', 'localhost', %s, %s)",
                (EPOCH, os.getpid(), benchclaims.LAYOUT_JSON),
            )
            cut_blocks(conn, 0, plan.pool_blocks)
            conn.execute("VACUUM ANALYZE")
            conn.execute("CHECKPOINT")  # the stocking's WAL must not trigger one mid-run
        yield RUN_DB
    finally:
        benchclaims.drop_database(server, RUN_DB)


def _connect_consumer(server: Server, database: str) -> psycopg.Connection[Any]:
    conninfo, env = server.claim_conninfo(database)
    options = env.get("PGOPTIONS")
    if options:
        return psycopg.connect(conninfo, options=options)
    return psycopg.connect(conninfo)


def measure_run(
    server: Server, plan: Plan, revision: str, progress: Callable[[str], None]
) -> RunResult:
    """One run: warm-up, then a claim held open across ``plan.claims`` claims, the leader
    ticking all along and the reader during the measured claims."""
    with run_database(server, revision, plan) as database:
        url = server.url(database)
        functions = migrate.current_revision(url) or "?"
        leader = Leader(url, plan, next_block=plan.pool_blocks)
        reader = Reader(url, plan)
        leader.start()
        try:
            if warmup := plan.warmup_claims():
                progress(f"{functions}: warm-up, {warmup:,} claims (the pool turns over)")
                _, dry, _ = _claims(server, database, plan, warmup)
                if dry:
                    raise BenchError("the warm-up ran the pool dry: raise --pool-blocks")
            holder = _connect_consumer(server, database)
            try:
                held_block, bound = _hold_claim(holder)
                progress(
                    f"{functions}: one claim held open (block {held_block}); "
                    f"{plan.total_claims():,} claims at {plan.rate:,}/s by {plan.clients} "
                    "pgbench clients"
                )
                started = time.monotonic()
                wall_started = time.time()
                reader.start()
                try:
                    claims, aborted, stderr = _claims(server, database, plan, plan.total_claims())
                finally:
                    reader.stop()
                    leader.stop()
                took = time.monotonic() - started
                for ticker in (leader, reader):
                    if ticker.error is not None:
                        raise BenchError(f"{ticker.name} failed: {ticker.error}") from ticker.error
                held = _held_at_end(url, held_block, holder)
                held["idle_bound_set_by_claim"] = bound
                holder.rollback()
            finally:
                holder.close()
        finally:
            leader.stop()
        held.update(_after_rollback(url, held_block, plan))
    if aborted and "AL003" not in stderr and "pool empty" not in stderr:
        raise BenchError("pgbench: a client aborted: " + " | ".join(stderr.splitlines()[-3:]))
    if not claims:
        raise BenchError("pgbench logged no claim")
    window = plan.window_claims()
    spans = Spans(
        claims,
        {
            "pool_status": reader.samples,
            "requeue_stranded": leader.samples,
            "requeue_commit": leader.commits,
        },
        wall_started,
    )
    return RunResult(
        functions=functions,
        claims=len(claims),
        window_claims=window,
        seconds=round(took, 2),
        claims_per_s=round(len(claims) / max(claims[-1].ended - wall_started, 1e-9), 1),
        leader_ticks=len(leader.samples),
        blocks_cut=leader.blocks_cut,
        blocks_requeued=leader.moved,
        pool_ran_dry=aborted,
        measures=spans.measures(window),
        held=held,
        load=spans.load(window),
        profile=spans.profile(PROFILE_BUCKETS),
    )


def _hold_claim(holder: psycopg.Connection[Any]) -> tuple[int, str | None]:
    """The slow consumer: one claim in a transaction left open; its block, and the idle
    bound the claim set on that transaction."""
    row = holder.execute(
        "SELECT block_id FROM allocator.claim_blocks(%s, 1)", (HELD_CONSUMER,)
    ).fetchone()
    if row is None:
        raise BenchError("the held claim got no block")
    bound = holder.execute("SHOW idle_in_transaction_session_timeout").fetchone()
    # Lift the claim's idle bound for this experiment only: the transaction must stay open
    # for the whole run. SET LOCAL, later in the same transaction, overrides the setting
    # claim_blocks made; the server reads it each time the session goes idle.
    holder.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
    return int(row[0]), str(bound[0]) if bound else None


def _claims(server: Server, database: str, plan: Plan, count: int) -> tuple[list[Claim], bool, str]:
    """``count`` claims by pgbench at the plan's rate; every claim's end time and execution
    time, by end time; whether a client aborted (AL003) and pgbench's stderr."""
    conninfo, env = server.claim_conninfo(database)
    with tempfile.TemporaryDirectory(prefix="bench-slow-") as tmp:
        folder = Path(tmp)
        script_path = folder / "claim_blocks.pgbench"
        script_path.write_text(benchclaims.script("claim_blocks.pgbench"))
        argv = [
            str(server.pgbench),
            "-n",
            "-M",
            "prepared",
            "-c",
            str(plan.clients),
            "-j",
            str(min(plan.clients, 2)),
            "-R",
            str(plan.rate),
            "-t",
            str(math.ceil(count / plan.clients)),
            "-f",
            str(script_path),
            "-D",
            "batch=1",
            "-l",
            f"--log-prefix={folder / 'tx'}",
            conninfo,
        ]
        limit = count / plan.rate * 3 + PGBENCH_GRACE_S
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=limit,
                check=False,
                env={**process_environment(), "PGAPPNAME": "bench-slow-consumer", **env},
            )
        except subprocess.TimeoutExpired as exc:  # run() has killed pgbench
            raise BenchError(f"pgbench ran over {limit:.0f} s") from exc
        aborted = done.returncode == 2 and "aborted" in done.stderr
        if done.returncode != 0 and not aborted:
            raise BenchError(
                f"pgbench failed (exit {done.returncode}): "
                + " | ".join(done.stderr.strip().splitlines()[-3:])
            )
        return _read_claims(folder), aborted, done.stderr


_LOG_LINE = re.compile(r"^\d+ \d+ (\d+) \d+ (\d+) (\d+) (\d+)")


def _read_claims(folder: Path) -> list[Claim]:
    """pgbench -R logs ``client tx time_us script epoch_s epoch_us lag_us`` per line."""
    claims: list[Claim] = []
    for path in folder.glob("tx.*"):
        with path.open() as lines:
            for line in lines:
                if match := _LOG_LINE.match(line):
                    total, seconds, micros, lag = (int(g) for g in match.groups())
                    claims.append(Claim(ended=seconds + micros / 1e6, exec_us=total - lag))
    claims.sort(key=lambda c: c.ended)
    return claims


class Spans:
    """Claims (sorted by end time) and the timed samples of each ticking thread, cut into
    spans of consecutive claims: a span's samples are those that started while its claims
    were completing."""

    def __init__(
        self, claims: list[Claim], samples: dict[str, list[Sample]], wall_started: float
    ) -> None:
        self._claims = claims
        self._samples = samples
        self._wall_started = wall_started

    def span(self, begin: int, end: int) -> tuple[dict[str, list[int]], list[float]]:
        """Latencies (µs) of claims ``begin … end - 1`` and of every sampled statement in
        their span of time, by measure; and the load averages seen by those samples."""
        since = self._claims[begin - 1].ended if begin > 0 else self._wall_started
        until = self._claims[end - 1].ended
        found: dict[str, list[int]] = {"claim": [c.exec_us for c in self._claims[begin:end]]}
        loads: list[float] = []
        for name, samples in self._samples.items():
            inside = [s for s in samples if since <= s.started <= until]
            found[name] = [s.took_us for s in inside]
            loads += [s.load1 for s in inside]
        return found, loads

    def ends(self, window: int) -> tuple[int, int]:
        """Where the last window begins, and the number of claims."""
        total = len(self._claims)
        return total - window, total

    def measures(self, window: int) -> dict[str, Measure]:
        (first, _), (last, _) = self.span(0, window), self.span(*self.ends(window))
        return {name: Measure.of(first[name], last[name]) for name in REPORTED}

    def load(self, window: int) -> dict[str, float | None]:
        """The machine's mean 1-minute load average during the first and the last window."""
        (_, first), (_, last) = self.span(0, window), self.span(*self.ends(window))
        return {"first": _mean(first), "last": _mean(last)}

    def profile(self, buckets: int) -> list[dict[str, Any]]:
        """p50/p99 of each measure over ``buckets`` equal runs of consecutive claims: how
        the costs move along the whole run, not only at its two ends."""
        total = len(self._claims)
        rows: list[dict[str, Any]] = []
        for k in range(buckets):
            begin, end = total * k // buckets, total * (k + 1) // buckets
            if end <= begin:
                continue
            found, _ = self.span(begin, end)
            row: dict[str, Any] = {"claims_done": end}
            for name in REPORTED:
                window = _window(found[name])
                row[name] = {"p50_ms": window.p50_ms, "p99_ms": window.p99_ms}
                row[name]["samples"] = window.samples
            rows.append(row)
        return rows


def _held_at_end(url: str, block_id: int, holder: psycopg.Connection[Any]) -> dict[str, Any]:
    """What the leader's tables say about the open claim after two more leader runs (the
    second considers every ticket drawn), and whether the claim is still open."""
    try:
        holder.execute("SELECT 1")
        survived = True
    except psycopg.Error:
        survived = False
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(2):
            conn.execute(REQUEUE, (EPOCH,))
        floor = conn.execute(FLOOR).fetchone()
        position = conn.execute(POSITION).fetchone()
        pages = conn.execute(HIGH_WATER_PAGES).fetchone()
        listed: bool | None = None
        if _has_held_tickets(conn):
            found = conn.execute(
                "SELECT 1 FROM allocator.held_tickets WHERE block_id = %s", (block_id,)
            ).fetchone()
            listed = found is not None
    requeued_upto, requeue_mark = (int(v) for v in floor) if floor else (0, 0)
    return {
        "block_id": block_id,
        "survived": survived,
        "in_held_tickets": listed,
        "requeued_upto": requeued_upto,
        "requeue_mark": requeue_mark,
        "claim_position": int(position[0]) if position else 0,
        "floor_lag_tickets": (int(position[0]) if position else 0) - requeued_upto,
        "high_water_pages": int(pages[0]) if pages else None,
    }


def _has_held_tickets(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(HAS_HELD_TICKETS).fetchone()
    return bool(row and row[0])


def _after_rollback(url: str, block_id: int, plan: Plan) -> dict[str, Any]:
    """After the holder rolled back: leader runs until the block is back in the queue (a
    fresh ticket after the claim position, unclaimed), then claims until it comes out."""
    back_after: int | None = None
    with psycopg.connect(url, autocommit=True) as conn:
        for run in range(1, REQUEUE_RUNS_AFTER_ROLLBACK + 1):
            conn.execute(REQUEUE, (EPOCH,))
            row = conn.execute(
                "SELECT b.claimed_at IS NULL AND b.ticket > (" + POSITION + ")"
                " FROM allocator.blocks b WHERE b.block_id = %s",
                (block_id,),
            ).fetchone()
            if row and row[0]:
                back_after = run
                break
        claimed_again = False
        if back_after is not None:
            for _ in range(plan.pool_blocks // 1000 + 3):
                try:
                    rows = conn.execute(
                        "SELECT block_id FROM allocator.claim_blocks('bench-drain', 1000)"
                    ).fetchall()
                except psycopg.Error:
                    break  # AL003: the pool is empty
                if any(int(r[0]) == block_id for r in rows):
                    claimed_again = True
                    break
    return {
        "requeued_after_rollback": back_after is not None,
        "requeue_runs_after_rollback": back_after,
        "claimed_again": claimed_again,
    }


def run_plan(server: Server, plan: Plan, progress: Callable[[str], None]) -> list[RunResult]:
    results: list[RunResult] = []
    try:
        for revision in plan.revisions:
            progress(f"stocking {RUN_DB} at revision {revision} ({plan.pool_blocks:,} blocks)")
            results.append(measure_run(server, plan, revision, progress))
    except psycopg.Error as exc:
        raise BenchError(f"the bench failed: {type(exc).__name__}: {exc}") from exc
    return results


def _window(samples_us: list[int]) -> Window:
    ordered = sorted(samples_us)
    return Window(
        samples=len(ordered),
        p50_ms=benchclaims.percentile_ms(ordered, 0.50),
        p99_ms=benchclaims.percentile_ms(ordered, 0.99),
    )


def _ratio(last: float, first: float) -> float | None:
    return round(last / first, 3) if first > 0 else None


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 2) if values else None

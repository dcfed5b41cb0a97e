"""``allocator bench claims``: our ``claim_blocks`` next to three baselines, driven by pgbench.

Rules:

- One PostgreSQL server for everything (the embedded cluster, or a superuser URL). The bench
  works in databases of its own (:data:`TEMPLATE_DB`, :data:`RUN_DB`), never in the
  allocator's database: a migrated template is stocked once, then every measured run gets a
  fresh clone (``CREATE DATABASE … TEMPLATE … STRATEGY FILE_COPY``, then ``CHECKPOINT``), so
  every method and client count starts from the same pool state. Clones are dropped after
  their run; the template at the end.
- Stocking: the pool is cut as a leader would (``take_fence`` once, ``cut_blocks`` in arrays
  of :data:`CUT_BATCH_BLOCKS`), the SKIP LOCKED queue gets the same blocks, then
  ``VACUUM ANALYZE`` (the template only; a measured clone is never vacuumed by hand). The
  schema is used as migrated (blocks are stocked through ``cut_blocks``, with its fence,
  high-water and overlap checks).
- Methods, one pgbench script each (``allocator/bench_sql``): ``claim_blocks`` as the
  consumer role (``allocator_app`` on the embedded cluster; with ``--database-url`` the
  superuser with ``role=allocator_consumer``), and, as the superuser, ``skip_locked``,
  ``segment_update`` (step = batch x block size) and ``nextval`` (CACHE 100; one ID per call,
  run at batch 1 only: the ceiling), and a reference, ``durable_commit`` (a one-row INSERT
  into an unindexed table per transaction, batch 1 only: the fastest durable transaction,
  so the ceiling of every durable claim). Every other commit is synchronous (the server
  default is on and ``claim_blocks`` forces it); nothing here turns durability down.
- Load: ``pgbench -n -M prepared -c C -j min(C, 2) -T seconds -l``; claims/s is pgbench's
  tps without connection time, p50/p99 come from every transaction in the per-transaction
  logs. A run whose pool ran dry (no unclaimed block left, or a client aborted on AL003) is
  flagged ``pool_exhausted``: its numbers understate the method.
- Prior claims: a clone first takes ``prior_claims`` claims with pgbench (``-t``, as the
  consumer), then ``requeue_stranded`` runs twice as the leader would; no manual VACUUM
  (autovacuum as configured). Its claim_blocks row carries ``vs_fresh``: its claims/s over
  the fresh clone's at the same clients and batch.
- Timings are reported, never judged (targets are printed next to them).
"""

from __future__ import annotations

import importlib.resources
import json
import logging
import math
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from allocator import migrate
from allocator.config import process_environment
from allocator.errors import AllocatorError, PrerequisiteError
from allocator.layout import Layout

log = logging.getLogger(__name__)

METHODS: Final = ("claim_blocks", "skip_locked", "segment_update", "nextval", "durable_commit")
BASELINES: Final = ("skip_locked", "segment_update", "nextval")
REFERENCE: Final = "durable_commit"
"""Not a way to claim: the cheapest durable write transaction, the ceiling of any durable
claim on this server (so a ratio to ``nextval`` it cannot reach is visible as such)."""
ONCE_METHODS: Final = ("nextval", REFERENCE)
"""Methods that take no batch: run once, at batch 1."""
BLOCK_SIZE_IDS = 4096
EPOCH = 1
BENCH_LAYOUT = Layout()
LAYOUT_JSON = json.dumps(BENCH_LAYOUT.record(0))
"""The default layout, datacenter 0: what ``cut_blocks`` records and checks (migration 0003)."""
CUT_BATCH_BLOCKS = 50_000
TEMPLATE_DB = "bench_claims_template"
RUN_DB = "bench_claims_run"
CONSUMER_GROUP = "allocator_consumer"
AUTO_POOL_CLAIMS_PER_S = 60_000
"""Pool sizing: above any claim rate seen on a 2-core machine (the issue quotes ~44k/s)."""
AUTO_POOL_BATCH_CALLS_PER_S = 25_000
"""Pool sizing for batch > 1: calls/s ceiling of a batched claim (each takes ``batch``)."""
PGBENCH_GRACE_S = 120.0
TARGETS: Final = {
    "vs_skip_locked": 5.0,
    "vs_segment_update": 10.0,
    "vs_nextval": 0.4,
    "p99_ms_below": 5.0,
    "prior_vs_fresh": 0.9,
}
SERVER_SETTINGS: Final = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "commit_delay",
    "commit_siblings",
    "wal_writer_delay",
    "wal_buffers",
    "shared_buffers",
    "max_wal_size",
    "autovacuum",
    "autovacuum_naptime",
)
TABLE_STATS: Final = """
SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup, n_live_tup, autovacuum_count,
       pg_relation_size(relid) AS heap_bytes
  FROM pg_stat_user_tables WHERE relid = %s::regclass
"""
UNCLAIMED: Final = {
    "claim_blocks": "SELECT count(*) FROM allocator.blocks WHERE claimed_at IS NULL",
    "skip_locked": "SELECT count(*) FROM bench.skip_locked_queue WHERE claimed_at IS NULL",
}
TABLES: Final = {"claim_blocks": "allocator.blocks", "skip_locked": "bench.skip_locked_queue"}


class BenchError(AllocatorError):
    """The benchmark could not run (pgbench failed, the server refused a setup step)."""


@dataclass(frozen=True)
class Plan:
    clients: tuple[int, ...]
    seconds: float
    batches: tuple[int, ...]
    prior_claims: int = 0
    prior_clients: tuple[int, ...] = ()
    pool_blocks: int = 0
    """0: sized from the longest run (:func:`auto_pool_blocks`)."""

    def stocked_blocks(self) -> int:
        pool = self.pool_blocks or auto_pool_blocks(self.seconds, max(self.batches))
        return pool + self.prior_claims * max(self.batches if self.prior_claims else (1,))


def auto_pool_blocks(seconds: float, batch: int) -> int:
    rate = AUTO_POOL_CLAIMS_PER_S if batch == 1 else AUTO_POOL_BATCH_CALLS_PER_S * batch
    return max(10_000, math.ceil(seconds * rate))


@dataclass
class Result:
    method: str
    clients: int
    batch: int
    prior_claims: int
    claims: int
    seconds: float
    claims_per_s: float
    ids_per_claim: int
    ids_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    pool_exhausted: bool
    generator_cpu_share: float = 0.0
    """pgbench's own CPU time over the run's CPU capacity (seconds x CPUs): how much of the
    machine the load generator took (well below 1: it was not the bottleneck)."""
    ratio_vs: dict[str, float] = field(default_factory=dict)
    """claim_blocks rows: claims/s over each baseline's at the same clients (and batch;
    nextval always at batch 1)."""
    ids_ratio_vs: dict[str, float] = field(default_factory=dict)
    vs_fresh: float | None = None
    table_stats: dict[str, Any] = field(default_factory=dict)
    prior_stats: dict[str, Any] = field(default_factory=dict)

    def key(self) -> tuple[str, int, int, int]:
        return (self.method, self.clients, self.batch, self.prior_claims)


@dataclass(frozen=True)
class Pgbench:
    transactions: int
    tps: float
    latencies_us: list[int]
    aborted: bool
    stderr: str
    cpu_s: float
    """CPU time (user + system) pgbench itself used: the load generator's own cost."""


@dataclass
class Server:
    """Where the bench connects: the superuser URL, and how claim_blocks logs in."""

    superuser_url: str
    consumer_url: str | None = None
    """A login role granted allocator_consumer (the embedded ``allocator_app``); None: the
    superuser with ``role=allocator_consumer``."""
    pgbench: Path = field(default_factory=lambda: find_pgbench())

    def url(self, database: str) -> str:
        return with_database(self.superuser_url, database)

    def claim_conninfo(self, database: str) -> tuple[str, dict[str, str]]:
        if self.consumer_url:
            return with_database(self.consumer_url, database), {}
        return self.url(database), {"PGOPTIONS": f"-c role={CONSUMER_GROUP}"}

    def claim_role(self) -> str:
        if self.consumer_url:
            return urlsplit(self.consumer_url).username or "?"
        return f"{urlsplit(self.superuser_url).username} as {CONSUMER_GROUP}"


def find_pgbench() -> Path:
    try:
        from allocator.local import postgres

        candidate = postgres.find_bin_dir() / "pgbench"
        if candidate.is_file():
            return candidate
    except PrerequisiteError:
        pass
    if found := shutil.which("pgbench"):
        return Path(found)
    raise PrerequisiteError("pgbench is not installed (it comes with the PostgreSQL client)")


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


def script(name: str) -> str:
    return importlib.resources.files("allocator.bench_sql").joinpath(name).read_text()


# --- databases -------------------------------------------------------------------------


def _admin(server: Server) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(server.url("postgres"), autocommit=True, connect_timeout=10)


def drop_database(server: Server, name: str) -> None:
    with _admin(server) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def server_settings(server: Server) -> dict[str, str]:
    with _admin(server) as admin:
        return {
            name: str(row[0])
            for name in SERVER_SETTINGS
            if (row := admin.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone())
        }


def build_template(server: Server, blocks: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """Create, migrate and stock :data:`TEMPLATE_DB` with ``blocks`` blocks in both queues."""
    drop_database(server, RUN_DB)
    drop_database(server, TEMPLATE_DB)
    with _admin(server) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE_DB)))
    url = server.url(TEMPLATE_DB)
    progress(f"migrating {TEMPLATE_DB}")
    migrate.upgrade_to_head(url)
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(script("setup.sql"))
        conn.execute(
            "SELECT * FROM allocator.take_fence(0, %s, 'bench', 'localhost', %s, %s)",
            (EPOCH, os.getpid(), LAYOUT_JSON),
        )
        progress(f"cutting {blocks:,} blocks of {BLOCK_SIZE_IDS} IDs (cut_blocks)")
        for start in range(0, blocks, CUT_BATCH_BLOCKS):
            count = min(CUT_BATCH_BLOCKS, blocks - start)
            ranges = [BENCH_LAYOUT.nth_block(start + k, BLOCK_SIZE_IDS) for k in range(count)]
            firsts = [first for first, _ in ranges]
            lasts = [last for _, last in ranges]
            conn.execute(
                "SELECT * FROM allocator.cut_blocks(0, %s, %s, %s, %s, 1000)",
                (EPOCH, firsts, lasts, LAYOUT_JSON),
            )
        conn.execute(script("stock_queue.sql"), {"blocks": blocks, "block_size": BLOCK_SIZE_IDS})
        progress("VACUUM ANALYZE of the template")
        conn.execute("VACUUM ANALYZE")
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return {
        "database": TEMPLATE_DB,
        "blocks": blocks,
        "block_size_ids": BLOCK_SIZE_IDS,
        "stock_s": round(time.monotonic() - started, 2),
        "bytes": int(size[0]) if size else 0,
        "schema": "as migrated (stocked through cut_blocks)",
    }


@contextmanager
def fresh_database(server: Server) -> Iterator[str]:
    """A clone of the stocked template, checkpointed, dropped afterwards."""
    drop_database(server, RUN_DB)
    with _admin(server) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(RUN_DB), sql.Identifier(TEMPLATE_DB)
            )
        )
        admin.execute("CHECKPOINT")
    try:
        yield RUN_DB
    finally:
        drop_database(server, RUN_DB)


# --- pgbench ---------------------------------------------------------------------------


def run_pgbench(
    server: Server,
    conninfo: str,
    script_name: str,
    clients: int,
    *,
    seconds: float | None = None,
    transactions: int | None = None,
    defines: dict[str, int] | None = None,
    env: dict[str, str] | None = None,
    latency_log: bool = True,
) -> Pgbench:
    """One pgbench run of a bundled script; the per-transaction latencies when logged."""
    with tempfile.TemporaryDirectory(prefix="bench-claims-") as tmp:
        folder = Path(tmp)
        script_path = folder / script_name
        script_path.write_text(script(script_name))
        argv = [
            str(server.pgbench),
            "-n",
            "-M",
            "prepared",
            "-c",
            str(clients),
            "-j",
            str(min(clients, 2)),
            "-f",
            str(script_path),
        ]
        if seconds is not None:
            argv += ["-T", str(max(1, round(seconds)))]
        if transactions is not None:
            argv += ["-t", str(transactions)]
        for name, value in (defines or {}).items():
            argv += ["-D", f"{name}={value}"]
        if latency_log:
            argv += ["-l", f"--log-prefix={folder / 'tx'}"]
        argv.append(conninfo)
        limit = (seconds or 0) + PGBENCH_GRACE_S + (transactions or 0) * clients / 1000
        cpu_before = _children_cpu_s()
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=limit,
                check=False,
                env={
                    **process_environment(),
                    "PGAPPNAME": f"bench-{script_name}",
                    **(env or {}),
                },
            )
        except subprocess.TimeoutExpired as exc:  # run() has killed pgbench
            raise BenchError(f"pgbench {script_name} ran over {limit:.0f} s") from exc
        aborted = done.returncode == 2 and "aborted" in done.stderr
        if done.returncode != 0 and not aborted:
            raise BenchError(
                f"pgbench {script_name} failed (exit {done.returncode}): "
                + " | ".join(done.stderr.strip().splitlines()[-3:])
            )
        processed = re.search(r"number of transactions actually processed: (\d+)", done.stdout)
        tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", done.stdout)
        latencies = _read_logs(folder) if latency_log else []
    return Pgbench(
        cpu_s=round(_children_cpu_s() - cpu_before, 3),
        transactions=int(processed.group(1)) if processed else 0,
        tps=float(tps.group(1)) if tps else 0.0,
        latencies_us=latencies,
        aborted=aborted,
        stderr=done.stderr,
    )


def _children_cpu_s() -> float:
    """User + system CPU seconds of every child process waited for so far (pgbench runs
    one at a time, so the difference around a run is that run's)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _read_logs(folder: Path) -> list[int]:
    """Per-transaction logs: ``client tx latency_us script epoch_s epoch_us`` per line."""
    latencies: list[int] = []
    for path in folder.glob("tx.*"):
        with path.open() as lines:
            latencies.extend(int(line.split(maxsplit=3)[2]) for line in lines)
    latencies.sort()
    return latencies


def percentile_ms(sorted_us: Sequence[int], q: float) -> float:
    """Nearest rank: the smallest sample with at least ``q`` of all samples at or below."""
    if not sorted_us:
        return 0.0
    rank = max(1, min(len(sorted_us), math.ceil(q * len(sorted_us))))
    return round(sorted_us[rank - 1] / 1000, 3)


# --- runs ------------------------------------------------------------------------------


def _script_for(method: str, batch: int) -> tuple[str, dict[str, int]]:
    if method == "claim_blocks":
        return "claim_blocks.pgbench", {"batch": batch}
    if method == "skip_locked":
        return (
            ("skip_locked.pgbench", {})
            if batch == 1
            else (
                "skip_locked_batch.pgbench",
                {"batch": batch},
            )
        )
    if method == "segment_update":
        return "segment_update.pgbench", {"step": batch * BLOCK_SIZE_IDS}
    if method == REFERENCE:
        return "durable_commit.pgbench", {}
    return "nextval.pgbench", {}


def ids_per_claim(method: str, batch: int) -> int:
    if method == REFERENCE:
        return 0  # hands out nothing
    return 1 if method == "nextval" else batch * BLOCK_SIZE_IDS


def _table_stats(conn: psycopg.Connection[tuple[Any, ...]], method: str) -> dict[str, Any]:
    if method not in TABLES:
        return {}
    conn.execute("SELECT pg_stat_force_next_flush()")
    cursor = conn.execute(TABLE_STATS, (TABLES[method],))
    row = cursor.fetchone()
    names = [column.name for column in cursor.description or ()]
    stats = dict(zip(names, row, strict=True)) if row else {}
    unclaimed = conn.execute(UNCLAIMED[method]).fetchone()
    stats["unclaimed_blocks"] = int(unclaimed[0]) if unclaimed else 0
    return stats


def measure(
    server: Server,
    database: str,
    method: str,
    clients: int,
    batch: int,
    seconds: float,
    prior_claims: int = 0,
) -> Result:
    name, defines = _script_for(method, batch)
    if method == "claim_blocks":
        conninfo, env = server.claim_conninfo(database)
    else:
        conninfo, env = server.url(database), {}
    outcome = run_pgbench(
        server, conninfo, name, clients, seconds=seconds, defines=defines, env=env
    )
    with psycopg.connect(server.url(database), autocommit=True) as conn:
        stats = _table_stats(conn, method)
    lat = outcome.latencies_us
    exhausted = outcome.aborted or (method in TABLES and stats.get("unclaimed_blocks") == 0)
    if outcome.aborted and "AL003" not in outcome.stderr and "pool empty" not in outcome.stderr:
        raise BenchError(
            f"pgbench {name}: a client aborted: "
            + " | ".join(outcome.stderr.strip().splitlines()[-3:])
        )
    per_claim = ids_per_claim(method, batch)
    return Result(
        method=method,
        clients=clients,
        batch=batch,
        prior_claims=prior_claims,
        claims=outcome.transactions,
        seconds=seconds,
        claims_per_s=round(outcome.tps, 1),
        ids_per_claim=per_claim,
        ids_per_s=round(outcome.tps * per_claim),
        p50_ms=percentile_ms(lat, 0.50),
        p90_ms=percentile_ms(lat, 0.90),
        p99_ms=percentile_ms(lat, 0.99),
        p999_ms=percentile_ms(lat, 0.999),
        max_ms=percentile_ms(lat, 1.0),
        pool_exhausted=exhausted,
        generator_cpu_share=round(outcome.cpu_s / (seconds * (os.cpu_count() or 1)), 3),
        table_stats=stats,
    )


def take_prior_claims(
    server: Server, database: str, claims: int, clients: int, batch: int
) -> dict[str, Any]:
    """``claims`` claim_blocks calls (pgbench -t), then requeue_stranded twice as the leader."""
    per_client = max(1, claims // clients)
    conninfo, env = server.claim_conninfo(database)
    started = time.monotonic()
    outcome = run_pgbench(
        server,
        conninfo,
        "claim_blocks.pgbench",
        clients,
        transactions=per_client,
        defines={"batch": batch},
        env=env,
        latency_log=False,
    )
    if outcome.aborted:
        raise BenchError("prior claims ran the pool dry: raise --pool-blocks")
    took = time.monotonic() - started
    with psycopg.connect(server.url(database), autocommit=True) as conn:
        requeue_ms = []
        for _ in range(2):
            t0 = time.monotonic()
            conn.execute("SELECT allocator.requeue_stranded(0, %s)", (EPOCH,))
            requeue_ms.append(round((time.monotonic() - t0) * 1000, 1))
        stats = _table_stats(conn, "claim_blocks")
    return {
        "claims": outcome.transactions,
        "clients": clients,
        "seconds": round(took, 2),
        "claims_per_s": round(outcome.tps, 1),
        "requeue_stranded_ms": requeue_ms,
        "table_after": stats,
    }


def add_ratios(results: list[Result]) -> None:
    """claim_blocks rows get ``ratio_vs``/``ids_ratio_vs`` (same clients; batch, or 1 for
    nextval and the reference); prior-claims rows get ``vs_fresh``; the reference gets its
    ``ratio_vs`` nextval (how close any durable claim could come)."""
    index = {r.key(): r for r in results}
    for row in results:
        if row.method == REFERENCE:
            base = index.get(("nextval", row.clients, 1, 0))
            if base and base.claims_per_s > 0:
                row.ratio_vs["nextval"] = round(row.claims_per_s / base.claims_per_s, 3)
            continue
        if row.method != "claim_blocks":
            continue
        for other in (*BASELINES, REFERENCE):
            batch = 1 if other in ONCE_METHODS else row.batch
            base = index.get((other, row.clients, batch, 0))
            if base and base.claims_per_s > 0:
                row.ratio_vs[other] = round(row.claims_per_s / base.claims_per_s, 3)
                row.ids_ratio_vs[other] = round(row.ids_per_s / max(base.ids_per_s, 1), 3)
        if row.prior_claims:
            fresh = index.get(("claim_blocks", row.clients, row.batch, 0))
            if fresh and fresh.claims_per_s > 0:
                row.vs_fresh = round(row.claims_per_s / fresh.claims_per_s, 3)


def run_plan(
    server: Server, plan: Plan, progress: Callable[[str], None]
) -> tuple[list[Result], dict[str, Any]]:
    """The whole matrix: every batch, client count and method from a fresh clone, then the
    prior-claims runs. Returns the results and the template's description."""
    results: list[Result] = []
    try:
        template = build_template(server, plan.stocked_blocks(), progress)
        for batch in plan.batches:
            for clients in plan.clients:
                for method in METHODS:
                    run_batch = batch
                    if method in ONCE_METHODS:  # no batch: once, at batch 1
                        if batch != plan.batches[0]:
                            continue
                        run_batch = 1
                    progress(
                        f"{method}: {clients} client(s), batch {run_batch}, {plan.seconds:g} s"
                    )
                    with fresh_database(server) as database:
                        results.append(
                            measure(server, database, method, clients, run_batch, plan.seconds)
                        )
            if plan.prior_claims:
                for clients in plan.prior_clients:
                    progress(
                        f"claim_blocks after {plan.prior_claims:,} prior claims: "
                        f"{clients} client(s), batch {batch}"
                    )
                    with fresh_database(server) as database:
                        prior = take_prior_claims(
                            server, database, plan.prior_claims, clients, batch
                        )
                        progress(
                            f"prior claims took {prior['seconds']} s; requeue_stranded "
                            f"{prior['requeue_stranded_ms']} ms"
                        )
                        row = measure(
                            server,
                            database,
                            "claim_blocks",
                            clients,
                            batch,
                            plan.seconds,
                            prior_claims=prior["claims"],
                        )
                        row.prior_stats = prior
                        row.prior_claims = plan.prior_claims
                        results.append(row)
    except psycopg.Error as exc:
        raise BenchError(f"the bench failed: {type(exc).__name__}: {exc}") from exc
    finally:
        drop_database(server, TEMPLATE_DB)
    add_ratios(results)
    return results, template

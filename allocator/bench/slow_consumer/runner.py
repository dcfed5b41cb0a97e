"""``allocator bench slow-consumer``: what one claim left open costs everyone else.

A consumer claims in a transaction and sits idle, holding its block's row lock, while others
claim and the leader refills: do ``pool_status``, ``requeue_stranded`` and the claim cost as
much after many claims as at the start? Migration 0004 says yes (held tickets); the 0003
functions are measured the same way for comparison (docs/design.md §9).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from alembic import command
from psycopg import sql
from sqlalchemy.exc import SQLAlchemyError

from allocator.bench import kit
from allocator.bench.server import BenchError, Server, drop_database, server_settings
from allocator.bench.slow_consumer import queries, report
from allocator.bench.slow_consumer.pgbench import claims as _claims
from allocator.bench.slow_consumer.plan import HEAD, Plan
from allocator.bench.slow_consumer.queries import FLOOR, HIGH_WATER_PAGES, POSITION, REQUEUE
from allocator.bench.slow_consumer.stats import RunResult, Spans
from allocator.bench.slow_consumer.tickers import Leader, Reader, cut_blocks
from allocator.bench.stock import EPOCH, LAYOUT_JSON, TAKE_FENCE
from allocator.postgres import migrate

RUN_DB = "bench_slow_consumer_run"
REQUEUE_RUNS_AFTER_ROLLBACK = 3
HELD_CONSUMER = "bench-slow-consumer"
PROFILE_BUCKETS = 10


@contextmanager
def run_database(server: Server, revision: str, plan: Plan) -> Iterator[str]:
    """:data:`RUN_DB` at ``revision``, fenced and stocked with ``plan.pool_blocks``.

    A database of its own, never the allocator's, dropped afterwards. ``revision`` is
    ``head`` or an older one through Alembic (``0003``). ``VACUUM ANALYZE`` after stocking, so
    the planner knows the one-row tables as it does in a database that has been running.
    """
    drop_database(server, RUN_DB)
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
            conn.execute(TAKE_FENCE, (EPOCH, os.getpid(), LAYOUT_JSON))
            cut_blocks(conn, 0, plan.pool_blocks)
            conn.execute("VACUUM ANALYZE")
            conn.execute("CHECKPOINT")  # the stocking's WAL must not trigger one mid-run
        yield RUN_DB
    finally:
        drop_database(server, RUN_DB)


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
    ticking all along and the reader during the measured claims.

    The warm-up's claims are not measured: they make the pool both windows meet one cut
    during the run, like a live pool (the stock cut at setup was vacuumed, and reads faster).
    The claims run at a fixed rate, so the first and the last run under the same load. A
    pool that ran dry (a client aborted on AL003) is flagged, never an error.
    """
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
    row = holder.execute(queries.HOLD_CLAIM, (HELD_CONSUMER,)).fetchone()
    if row is None:
        raise BenchError("the held claim got no block")
    bound = holder.execute(queries.SHOW_IDLE_BOUND).fetchone()
    # Lift the claim's idle bound for this experiment only: the transaction must stay open
    # for the whole run. SET LOCAL, later in the same transaction, overrides the setting
    # claim_blocks made; the server reads it each time the session goes idle.
    holder.execute(queries.LIFT_IDLE_BOUND)
    return int(row[0]), str(bound[0]) if bound else None


def _held_at_end(url: str, block_id: int, holder: psycopg.Connection[Any]) -> dict[str, Any]:
    """What the leader's tables say about the open claim after two more leader runs (the
    second considers every ticket drawn), and whether the claim is still open.

    ``high_water_pages`` tells apart a cost no schema avoids: an open transaction holds back
    the horizon below which dead row versions may be removed, so the one-row ``high_water``
    keeps a version per leader write during the hold and every read of it walks them.
    """
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
            found = conn.execute(queries.IN_HELD_TICKETS, (block_id,)).fetchone()
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
    row = conn.execute(queries.HAS_HELD_TICKETS).fetchone()
    return bool(row and row[0])


def _after_rollback(url: str, block_id: int, plan: Plan) -> dict[str, Any]:
    """After the holder rolled back: leader runs (at most :data:`REQUEUE_RUNS_AFTER_ROLLBACK`)
    until the block is back in the queue (a fresh ticket after the claim position,
    unclaimed), then claims the pool dry until it comes out."""
    back_after: int | None = None
    with psycopg.connect(url, autocommit=True) as conn:
        for run in range(1, REQUEUE_RUNS_AFTER_ROLLBACK + 1):
            conn.execute(REQUEUE, (EPOCH,))
            row = conn.execute(queries.BACK_IN_QUEUE, (block_id,)).fetchone()
            if row and row[0]:
                back_after = run
                break
        claimed_again = False
        if back_after is not None:
            for _ in range(plan.pool_blocks // 1000 + 3):
                try:
                    rows = conn.execute(queries.DRAIN).fetchall()
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
    """One :func:`measure_run` per revision of the plan; a database error is a BenchError."""
    results: list[RunResult] = []
    try:
        for revision in plan.revisions:
            progress(f"stocking {RUN_DB} at revision {revision} ({plan.pool_blocks:,} blocks)")
            results.append(measure_run(server, plan, revision, progress))
    except psycopg.Error as exc:
        raise BenchError(f"the bench failed: {type(exc).__name__}: {exc}") from exc
    return results


def run(
    plan: Plan, database_url: str | None, state_dir: Path, keep: bool
) -> tuple[dict[str, Any], list[RunResult]]:
    """The bench as ``allocator bench slow-consumer`` runs it: on ``database_url`` or the
    embedded cluster in ``state_dir``; the JSON document and the results."""
    with kit.bench_server(database_url, state_dir, keep) as (server, cluster_json):
        settings = server_settings(server)
        load_before = os.getloadavg()
        started = time.monotonic()
        results = run_plan(server, plan, kit.progress)
        load_after = os.getloadavg()
    document = report.document(
        plan,
        results,
        claim_role=server.claim_role(),
        settings=settings,
        database="url" if database_url else "embedded",
        cluster=cluster_json,
        took_s=round(time.monotonic() - started, 1),
        machine=kit.machine(load_before, load_after),
    )
    return document, results

"""``allocator bench sustained``: pgbench claims from a live three-node cluster whose primary
has its synchronous standby, for as long as the run lasts, so the leader must cut what the
claims take; then, on the same server, a burst from a pre-filled pool and the
``durable_commit`` reference (``allocator bench claims``'s template and ``measure``).

Each sustained run starts from a refilled pool and is watched by a :class:`Sampler`;
timings are reported, never judged (docs/design.md §9).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psycopg

from allocator.bench import kit
from allocator.bench.claims.contenders import REFERENCE
from allocator.bench.claims.database import TEMPLATE_DB, build_template, fresh_database
from allocator.bench.claims.pgbench import run_pgbench
from allocator.bench.claims.plan import Result, auto_pool_blocks
from allocator.bench.claims.runner import measure
from allocator.bench.client.runner import wait_for_pool
from allocator.bench.server import (
    BenchError,
    Server,
    admin,
    drop_database,
    percentile_ms,
    server_settings,
)
from allocator.bench.sustained import evidence, queries, report
from allocator.bench.sustained.cpu import Roots
from allocator.bench.sustained.plan import NODES, Plan
from allocator.bench.sustained.watch import Watch
from allocator.config.sections import PoolConfig
from allocator.local.info import ClusterInfo

POOL_FULL_BLOCKS = int(PoolConfig.model_fields["min_blocks"].default)
"""A run starts once the pool holds the nodes' default ``pool.min_blocks``."""


def run(plan: Plan, state_dir: Path, keep: bool) -> dict[str, Any]:
    """The bench as ``allocator bench sustained`` runs it, on the embedded cluster in
    ``state_dir`` (1 ZooKeeper server, PostgreSQL and its synchronous standby, three nodes
    with their default configuration); the JSON document."""
    with kit.embedded_cluster(state_dir, keep, nodes=NODES, pg_standby=True) as (
        info,
        cluster_json,
    ):
        server = Server(superuser_url=info.database_url, consumer_url=info.consumer_database_url)
        settings = server_settings(server)
        with admin(server) as conn:
            standby = evidence.standby_state(conn)
        kit.progress(f"synchronous standby: {standby['standbys']}")
        roots = _roots(info)
        load_before = os.getloadavg()
        started = time.monotonic()
        try:
            sustained = [_sustained(server, info, plan, clients, roots) for clients in plan.clients]
            burst, burst_evidence, template = (
                _burst(server, info, plan, roots) if plan.burst else ([], [], {})
            )
            with admin(server) as conn:
                standby_after = evidence.standby_state(conn)
        except psycopg.Error as exc:
            raise BenchError(f"the bench failed: {type(exc).__name__}: {exc}") from exc
        load_after = os.getloadavg()
    return report.document(
        plan,
        sustained,
        burst,
        burst_evidence,
        standby={"before": standby, "after": standby_after},
        template=template,
        settings=settings,
        cluster=cluster_json,
        claim_role=server.claim_role(),
        took_s=round(time.monotonic() - started, 1),
        machine=kit.machine(load_before, load_after, **kit.hardware()),
    )


def _roots(info: ClusterInfo) -> Roots:
    standby = next((s.pid for s in info.pg_servers if s.role == "standby"), None)
    return Roots(
        primary=info.postgres.pid or 0,
        standby=standby,
        nodes=tuple(n.pid for n in info.nodes if n.pid),
        zookeeper=tuple(z.pid for z in info.zk_servers if z.pid),
    )


def _sustained(
    server: Server, info: ClusterInfo, plan: Plan, clients: int, roots: Roots
) -> dict[str, Any]:
    """One sustained run: pgbench claims ``claim_blocks('bench', batch)`` as the consumer on
    the allocator's own database for ``plan.seconds`` while the nodes refill, watched
    (:class:`Watch`)."""
    wait_for_pool(info.consumer_database_url, POOL_FULL_BLOCKS)
    kit.progress(f"sustained: {clients} client(s), batch {plan.batch}, {plan.seconds:g} s")
    with psycopg.connect(info.database_url, autocommit=True) as conn:
        size = conn.execute(queries.BLOCK_SIZE).fetchone()
        bound = _age_bound(conn)
    with Watch(server, info.database_url, plan, roots) as watch:
        outcome = run_pgbench(
            server,
            info.consumer_database_url,
            "claim_blocks.pgbench",
            clients,
            seconds=plan.seconds,
            defines={"batch": plan.batch},
        )
    pool_empty, aborted = _errors(outcome.stderr)
    lat = outcome.latencies_us
    ids_per_claim = plan.batch * (int(size[0]) if size else 0)
    pool = watch.sampler.pool_summary()
    claims = outcome.transactions
    return {
        "clients": clients,
        "batch": plan.batch,
        "seconds": plan.seconds,
        "claims": claims,
        "claims_per_s": round(outcome.tps, 1),
        "ids_per_claim": ids_per_claim,
        "ids_per_s": round(outcome.tps * ids_per_claim),
        "p50_ms": percentile_ms(lat, 0.50),
        "p90_ms": percentile_ms(lat, 0.90),
        "p99_ms": percentile_ms(lat, 0.99),
        "p999_ms": percentile_ms(lat, 0.999),
        "max_ms": percentile_ms(lat, 1.0),
        "age_bound_in_force": bound,
        "claim_errors": {"pool_empty": pool_empty, "aborted_clients": aborted},
        "pool_ran_dry": pool_empty > 0 or pool.get("min_blocks") == 0,
        "pool": pool,
        "cutter": {
            "cut_blocks_per_s": pool.get("cut_blocks_per_s"),
            "claimed_blocks_per_s": pool.get("claimed_blocks_per_s"),
            "cut_over_claimed": _ratio(
                pool.get("cut_blocks_per_s"), pool.get("claimed_blocks_per_s")
            ),
        },
        **watch.evidence(claims, claims, outcome.cpu_s),
        "series": {"pool": watch.sampler.pool, "standby": watch.sampler.replication},
    }


def _burst(
    server: Server, info: ClusterInfo, plan: Plan, roots: Roots
) -> tuple[list[Result], list[dict[str, Any]], dict[str, Any]]:
    """``allocator bench claims``'s measure of ``claim_blocks`` and of the reference at every
    client count, each from a fresh clone of a template stocked once, on this server, each
    watched as a sustained run is (its evidence, for the comparison).

    With ``plan.burst_age_bound`` the template holds a bound on an ID's age that no stocked
    block exceeds (:func:`~allocator.bench.claims.database.build_template`): the claims take
    the path a serving cluster's take and void nothing."""
    results: list[Result] = []
    watched: list[dict[str, Any]] = []
    template = build_template(
        server,
        auto_pool_blocks(plan.burst_seconds, plan.batch),
        kit.progress,
        age_bound=plan.burst_age_bound,
    )
    try:
        for clients in plan.clients:
            for method, batch in (("claim_blocks", plan.batch), (REFERENCE, 1)):
                kit.progress(f"burst {method}: {clients} client(s), {plan.burst_seconds:g} s")
                with fresh_database(server) as database:
                    with psycopg.connect(server.url(database), autocommit=True) as conn:
                        bound = _age_bound(conn)
                    with Watch(server, info.database_url, plan, roots) as watch:
                        row = measure(server, database, method, clients, batch, plan.burst_seconds)
                results.append(row)
                pgbench_s = row.generator_cpu_share * plan.burst_seconds * (os.cpu_count() or 1)
                found = watch.evidence(row.claims, 0, round(pgbench_s, 2))
                watched.append(
                    {"method": method, "clients": clients, "age_bound_in_force": bound, **found}
                )
    finally:
        drop_database(server, TEMPLATE_DB)
    return results, watched, template


def _age_bound(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(queries.AGE_BOUND).fetchone()
    return bool(row and row[0])


def _errors(stderr: str) -> tuple[int, int]:
    """Clients that aborted on AL003 (pool empty) and clients that aborted at all; any other
    abort is a :class:`BenchError`: the run measured something else."""
    lines = [line for line in stderr.splitlines() if "aborted in command" in line]
    empty = sum(1 for line in lines if "pool empty" in line)
    if len(lines) > empty:
        raise BenchError("pgbench: a client aborted: " + " | ".join(lines[-3:]))
    return empty, len(lines)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None

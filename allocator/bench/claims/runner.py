"""``allocator bench claims``: our ``claim_blocks`` next to three baselines, driven by pgbench.

This module drives the matrix (docs/design.md §9); the databases are
:mod:`~allocator.bench.claims.database`'s, the methods :mod:`~allocator.bench.claims.contenders`'.
Timings are reported, never judged (targets are printed next to them).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from allocator.bench import kit
from allocator.bench.claims import report
from allocator.bench.claims.contenders import (
    BASELINES,
    METHODS,
    ONCE_METHODS,
    REFERENCE,
    TABLES,
    ids_per_claim,
    script_for,
    table_stats,
)
from allocator.bench.claims.database import TEMPLATE_DB, build_template, fresh_database
from allocator.bench.claims.pgbench import run_pgbench
from allocator.bench.claims.plan import Plan, Result
from allocator.bench.server import BenchError, Server, drop_database, percentile_ms, server_settings
from allocator.bench.stock import EPOCH


def measure(
    server: Server,
    database: str,
    method: str,
    clients: int,
    batch: int,
    seconds: float,
    prior_claims: int = 0,
) -> Result:
    """One method at one client count and batch on ``database``, for ``seconds``.

    ``claim_blocks`` runs as the consumer role (``allocator_app`` on the embedded cluster;
    with ``--database-url`` the superuser with ``role=allocator_consumer``), the others as
    the superuser. Every commit is synchronous (the server default, and ``claim_blocks``
    forces it): nothing here turns durability down. claims/s is pgbench's tps without
    connection time; p50/p99 come from every transaction in the per-transaction logs. A run
    whose pool ran dry (no unclaimed block left, or a client aborted on AL003) is flagged
    ``pool_exhausted``: its numbers understate the method.
    """
    name, defines = script_for(method, batch)
    if method == "claim_blocks":
        conninfo, env = server.claim_conninfo(database)
    else:
        conninfo, env = server.url(database), {}
    outcome = run_pgbench(
        server, conninfo, name, clients, seconds=seconds, defines=defines, env=env
    )
    with psycopg.connect(server.url(database), autocommit=True) as conn:
        stats = table_stats(conn, method)
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
    """``claims`` claim_blocks calls (pgbench -t, as the consumer), then requeue_stranded twice
    as the leader would; no manual VACUUM (autovacuum as configured)."""
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
        stats = table_stats(conn, "claim_blocks")
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
        template = build_template(server, plan.stocked_blocks(), progress, age_bound=plan.age_bound)
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


def run(
    plan: Plan, database_url: str | None, state_dir: Path, keep: bool
) -> tuple[dict[str, Any], list[Result]]:
    """The bench as ``allocator bench claims`` runs it: on ``database_url`` or the embedded
    cluster in ``state_dir``; the JSON document and the results."""
    with kit.bench_server(database_url, state_dir, keep) as (server, cluster_json):
        settings = server_settings(server)
        load_before = os.getloadavg()
        started = time.monotonic()
        results, template = run_plan(server, plan, kit.progress)
        load_after = os.getloadavg()
    document = report.document(
        plan,
        results,
        claim_role=server.claim_role(),
        template=template,
        settings=settings,
        database="url" if database_url else "embedded",
        cluster=cluster_json,
        took_s=round(time.monotonic() - started, 1),
        machine=kit.machine(load_before, load_after),
    )
    return document, results

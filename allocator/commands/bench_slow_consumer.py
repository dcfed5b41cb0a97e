"""``allocator bench slow-consumer``: one claim held open across many claims, measured.

Rules:

- Database: ``--database-url`` (a superuser URL: the bench creates and drops a database of
  its own there), or, without it, the embedded cluster in ``--state-dir`` (1 ZooKeeper
  server, no node: the bench is the only leader), brought up here and stopped (by pid,
  through :class:`~allocator.local.cluster.LocalCluster`) at the end unless ``--keep``.
  What is measured and how: :mod:`allocator.benchslow`.
- ``--compare`` (the default) runs the same experiment a second time on a database
  migrated only to 0003, the functions before held tickets, to show what they cost.
- Output: a table on stdout (``--json``: the JSON instead), the JSON written to
  ``--json-out`` (default ``<state-dir>/bench-slow-consumer-<UTC time>.json``). Progress
  goes to stderr. Timings are reported next to the target, never judged; the machine's
  load is recorded with them.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from allocator import benchclaims, benchslow
from allocator.benchclaims import Server
from allocator.benchslow import Plan, RunResult
from allocator.commands import benchkit, options
from allocator.commands.bench_client import bench

DEFAULT_STATE_DIR = Path(".run/bench-slow-consumer")


@bench.command("slow-consumer")
@click.option(
    "--claims",
    type=click.IntRange(100, 10_000_000),
    default=Plan.claims,
    show_envvar=True,
    help="Claims made while one claim is held open (pgbench, one block each).",
)
@click.option(
    "--window",
    type=click.IntRange(10, 1_000_000),
    default=Plan.window,
    show_envvar=True,
    help="Claims in the first and the last window compared (at most half of --claims).",
)
@click.option(
    "--rate",
    type=click.IntRange(10, 1_000_000),
    default=Plan.rate,
    show_envvar=True,
    help="Claims per second, all clients together (pgbench -R): the same load throughout.",
)
@click.option(
    "--clients",
    type=click.IntRange(1, 500),
    default=Plan.clients,
    show_envvar=True,
    help="pgbench clients.",
)
@click.option(
    "--requeue-every",
    type=click.IntRange(1, 1_000_000),
    default=Plan.requeue_every,
    show_envvar=True,
    help="Claims between two leader ticks (requeue_stranded, then the refill).",
)
@click.option(
    "--status-every-ms",
    type=click.IntRange(1, 60_000),
    default=Plan.status_every_ms,
    show_envvar=True,
    help="Milliseconds between two reads of pool_status by the monitoring reader.",
)
@click.option(
    "--pool-blocks",
    type=click.IntRange(100, 10_000_000),
    default=Plan.pool_blocks,
    show_envvar=True,
    help="Pool level the leader keeps (blocks cut up to it every tick).",
)
@click.option(
    "--warmup-claims",
    type=click.IntRange(0, 10_000_000),
    default=None,
    show_envvar=True,
    help="Claims before the held claim, not measured (the pool turns over). "
    "[default: twice --pool-blocks]",
)
@click.option(
    "--compare/--no-compare",
    default=True,
    show_envvar=True,
    help="Also run on a database at migration 0003 (the functions before held tickets).",
)
@options.database_url_option(
    help="A PostgreSQL superuser URL to bench on. [default: an embedded cluster in --state-dir]"
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_STATE_DIR,
    show_envvar=True,
    help="State folder of the embedded cluster (and of the JSON).",
)
@click.option(
    "--json-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    show_envvar=True,
    help="Where to write the JSON. [default: <state-dir>/bench-slow-consumer-<time>.json]",
)
@click.option(
    "--json", "as_json", is_flag=True, show_envvar=True, help="Print the JSON instead of the table."
)
@click.option("--keep", is_flag=True, show_envvar=True, help="Leave the embedded cluster running.")
def slow_consumer(
    claims: int,
    window: int,
    rate: int,
    clients: int,
    requeue_every: int,
    status_every_ms: int,
    pool_blocks: int,
    warmup_claims: int | None,
    compare: bool,
    database_url: str | None,
    state_dir: Path,
    json_out: Path | None,
    as_json: bool,
    keep: bool,
) -> None:
    """p50/p99 of pool_status, requeue_stranded and the claim, early and late, while one
    claim stays open (and, with --compare, the same on the 0003 functions)."""
    plan = Plan(
        claims=claims,
        window=window,
        rate=rate,
        clients=clients,
        requeue_every=requeue_every,
        status_every_ms=status_every_ms,
        pool_blocks=pool_blocks,
        warmup=warmup_claims,
        revisions=(benchslow.HEAD, benchslow.OLD_REVISION) if compare else (benchslow.HEAD,),
    )
    out = json_out or state_dir / f"bench-slow-consumer-{benchkit.timestamp()}.json"
    signal.signal(signal.SIGTERM, benchkit.on_sigterm)
    try:
        with _server(database_url, state_dir, keep) as (server, cluster_json):
            settings = benchclaims.server_settings(server)
            load_before = os.getloadavg()
            started = time.monotonic()
            results = benchslow.run_plan(server, plan, benchkit.progress)
            load_after = os.getloadavg()
    except KeyboardInterrupt:
        benchkit.progress("interrupted")
        raise click.Abort from None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    document: dict[str, Any] = {
        "results": [asdict(r) for r in results],
        "plan": {
            "claims": plan.total_claims(),
            "window_claims": plan.window_claims(),
            "rate": plan.rate,
            "clients": plan.clients,
            "requeue_every_claims": plan.requeue_every,
            "leader_tick_s": plan.tick_s(),
            "status_every_ms": plan.status_every_ms,
            "pool_blocks": plan.pool_blocks,
            "warmup_claims": plan.warmup_claims(),
            "revisions": list(plan.revisions),
            "pgbench": "-n -M prepared -c C -j min(C,2) -R rate -t claims/C -l",
            "claim_role": server.claim_role(),
            "held_claim": "after the warm-up, in a transaction kept open; SET LOCAL "
            "idle_in_transaction_session_timeout = 0 after the claim",
        },
        "targets": {"p99_ratio_max": benchslow.TARGET_P99_RATIO},
        "server": settings,
        "database": "url" if database_url else "embedded",
        "cluster": cluster_json,
        "took_s": round(time.monotonic() - started, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_before": list(load_before),
            "loadavg_after": list(load_after),
            "python": platform.python_version(),
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(document, indent=2))
    else:
        for line in _table(document, results):
            click.echo(line)
        click.echo(f"JSON written to {out}")
    benchkit.progress(f"JSON written to {out}")


@contextmanager
def _server(
    url: str | None, state_dir: Path, keep: bool
) -> Iterator[tuple[Server, dict[str, Any]]]:
    """The server to bench on: ``url``, or the embedded cluster (no node)."""
    if url:
        yield Server(superuser_url=url), dict(benchkit.NOT_EMBEDDED)
        return
    with benchkit.embedded_cluster(state_dir, keep) as (info, info_json):
        yield (
            Server(superuser_url=info.database_url, consumer_url=info.consumer_database_url),
            info_json,
        )


def _table(document: dict[str, Any], results: list[RunResult]) -> Iterator[str]:
    plan, machine = document["plan"], document["machine"]
    yield (
        f"allocator bench slow-consumer: one claim held open across {plan['claims']:,} claims "
        f"at {plan['rate']:,}/s ({plan['clients']} pgbench clients), leader every "
        f"{plan['requeue_every_claims']} claims, pool_status read every "
        f"{plan['status_every_ms']} ms, pool kept at {plan['pool_blocks']:,} blocks; "
        f"first vs last {plan['window_claims']:,} claims; {machine['cpus']} CPUs, load "
        f"{machine['loadavg_before'][0]:.2f} -> {machine['loadavg_after'][0]:.2f}"
    )
    yield ""
    yield (
        f"{'functions':<9} {'measured':<17} {'first p50':>9} {'first p99':>9} "
        f"{'last p50':>9} {'last p99':>9} {'p50 x':>7} {'p99 x':>7} {'samples':>13}"
    )
    for r in results:
        for name in benchslow.REPORTED:
            m = r.measures[name]
            yield (
                f"{r.functions:<9} {name:<17} {m.first.p50_ms:>9.3f} {m.first.p99_ms:>9.3f} "
                f"{m.last.p50_ms:>9.3f} {m.last.p99_ms:>9.3f} {_x(m.p50_ratio):>7} "
                f"{_x(m.p99_ratio):>7} {m.first.samples:>6}/{m.last.samples:<6}"
            )
    yield (
        "(ms; x = last / first; samples = first / last window; requeue_commit: the COMMIT "
        "after requeue_stranded, a WAL flush)"
    )
    yield ""
    for r in results:
        held = r.held
        yield (
            f"{r.functions}: held claim (block {held['block_id']}) "
            f"{'survived the run' if held['survived'] else 'DID NOT SURVIVE'}; at the end the "
            f"floor lagged the claim position by {held['floor_lag_tickets']:,} tickets"
            + f", high_water {held['high_water_pages']} pages"
            + (
                f", block {'listed' if held['in_held_tickets'] else 'NOT listed'} in held_tickets"
                if held["in_held_tickets"] is not None
                else ""
            )
            + "; after its rollback "
            + (
                f"requeued by {held['requeue_runs_after_rollback']} leader run(s) and "
                + ("claimed again" if held["claimed_again"] else "NOT claimed again")
                if held["requeued_after_rollback"]
                else "NOT requeued"
            )
            + (f"; claims {r.claims_per_s:,.0f}/s" if r.claims_per_s else "")
            + ("; POOL RAN DRY" if r.pool_ran_dry else "")
        )
    yield ""
    yield "p50 along the run, ms, by tenths of the claims (the windows above are the two ends):"
    for r in results:
        for name in benchslow.REPORTED:
            cells = " ".join(f"{row[name]['p50_ms']:>7.2f}" for row in r.profile)
            yield f"  {r.functions:<5} {name:<17} {cells}"
    for r in results:
        first, last = r.load.get("first"), r.load.get("last")
        if first is not None and last is not None:
            yield (
                f"  {r.functions}: machine load average {first:.2f} in the first window, "
                f"{last:.2f} in the last"
            )
    target = document["targets"]["p99_ratio_max"]
    yield ""
    yield f"target: p99 last/first <= {target:g} for all three (reported, not judged)"
    for r in results:
        marks = []
        for name in benchslow.MEASURES:
            ratio = r.measures[name].p99_ratio
            met = ratio is not None and ratio <= target
            marks.append(f"{name} {_x(ratio)} ({'met' if met else 'MISSED'})")
        yield f"  {r.functions}: " + ", ".join(marks)


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"

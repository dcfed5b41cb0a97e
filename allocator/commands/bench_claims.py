"""``allocator bench claims``: claim_blocks next to SKIP LOCKED, a segment, nextval and the
server's fastest durable commit.

Rules:

- Database: ``--database-url`` (a superuser URL: the bench creates and drops databases of
  its own there), or, without it, the embedded cluster in ``--state-dir`` (1 ZooKeeper
  server, no node: nobody cuts or requeues behind the bench's back), brought up here and
  stopped (by pid, through :class:`~allocator.local.cluster.LocalCluster`) at the end unless
  ``--keep``. What is measured and how: :mod:`allocator.benchclaims`.
- Output: a table on stdout (``--json``: the JSON instead), the JSON (DESIGN §10 keys, plus
  ``batch``, ``ratio_vs``, ``prior_claims`` and more) written to ``--json-out`` (default
  ``<state-dir>/bench-claims-<UTC time>.json``). Progress goes to stderr. Timings are
  reported next to the issue's targets, never judged; the machine's load is recorded.
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

from allocator import benchclaims
from allocator.benchclaims import Plan, Result, Server
from allocator.commands import benchkit, options
from allocator.commands.bench_client import bench

DEFAULT_STATE_DIR = Path(".run/bench-claims")


def _counts(text: str, option: str, upper: int) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a list like 1,8,32", param_hint=option) from None
    if not counts or any(not 1 <= count <= upper for count in counts):
        raise click.BadParameter(f"values must be 1..{upper}", param_hint=option)
    return tuple(dict.fromkeys(counts))


@bench.command("claims")
@click.option(
    "--clients",
    default="1,8,32",
    show_envvar=True,
    help="Comma-separated pgbench client counts, one run per method each.",
)
@click.option(
    "--seconds",
    type=click.IntRange(1, 600),
    default=10,
    show_envvar=True,
    help="Length of each measured run.",
)
@click.option(
    "--batch",
    default="1",
    show_envvar=True,
    help="Blocks per claim_blocks/skip_locked call (segment step x block size); "
    "comma-separated for several (nextval always takes 1 ID).",
)
@click.option(
    "--prior-claims",
    type=click.IntRange(0, 10_000_000),
    default=0,
    show_envvar=True,
    help="Also measure claim_blocks after this many claims on its table (e.g. 1000000).",
)
@click.option(
    "--prior-clients",
    default=None,
    show_envvar=True,
    help="Client counts of the prior-claims runs. [default: the largest of --clients]",
)
@click.option(
    "--pool-blocks",
    type=click.IntRange(0, 20_000_000),
    default=0,
    show_envvar=True,
    help="Blocks stocked for each run (0: enough for the longest run at 60k claims/s).",
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
    help="Where to write the JSON. [default: <state-dir>/bench-claims-<time>.json]",
)
@click.option(
    "--json", "as_json", is_flag=True, show_envvar=True, help="Print the JSON instead of the table."
)
@click.option("--keep", is_flag=True, show_envvar=True, help="Leave the embedded cluster running.")
def claims(
    clients: str,
    seconds: int,
    batch: str,
    prior_claims: int,
    prior_clients: str | None,
    pool_blocks: int,
    database_url: str | None,
    state_dir: Path,
    json_out: Path | None,
    as_json: bool,
    keep: bool,
) -> None:
    """Claims/s, IDs/s and p50/p99 of claim_blocks and three baselines, driven by pgbench."""
    client_counts = _counts(clients, "--clients", 500)
    plan = Plan(
        clients=client_counts,
        seconds=float(seconds),
        batches=_counts(batch, "--batch", 1000),
        prior_claims=prior_claims,
        prior_clients=(
            _counts(prior_clients, "--prior-clients", 500)
            if prior_clients
            else (max(client_counts),)
        ),
        pool_blocks=pool_blocks,
    )
    out = json_out or state_dir / f"bench-claims-{benchkit.timestamp()}.json"
    signal.signal(signal.SIGTERM, benchkit.on_sigterm)
    try:
        with _server(database_url, state_dir, keep) as (server, cluster_json):
            settings = benchclaims.server_settings(server)
            load_before = os.getloadavg()
            started = time.monotonic()
            results, template = benchclaims.run_plan(server, plan, benchkit.progress)
            load_after = os.getloadavg()
    except KeyboardInterrupt:
        benchkit.progress("interrupted")
        raise click.Abort from None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    document: dict[str, Any] = {
        "results": [asdict(r) for r in results],
        "plan": {
            "clients": list(plan.clients),
            "seconds": plan.seconds,
            "batches": list(plan.batches),
            "prior_claims": plan.prior_claims,
            "prior_clients": list(plan.prior_clients),
            "block_size_ids": benchclaims.BLOCK_SIZE_IDS,
            "pgbench": "-n -M prepared -c C -j min(C,2) -T seconds -l",
            "claim_role": server.claim_role(),
        },
        "targets": benchclaims.TARGETS,
        "template": template,
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


def _table(document: dict[str, Any], results: list[Result]) -> Iterator[str]:
    plan, machine = document["plan"], document["machine"]
    yield (
        f"allocator bench claims: {plan['seconds']:g} s per run, pgbench {plan['pgbench']}, "
        f"blocks of {plan['block_size_ids']} IDs, {document['template']['blocks']:,} blocks "
        f"stocked per run, {machine['cpus']} CPUs, load {machine['loadavg_before'][0]:.2f} "
        f"-> {machine['loadavg_after'][0]:.2f}"
    )
    yield ""
    yield (
        f"{'method':<15} {'clients':>7} {'batch':>5} {'prior':>9} {'claims/s':>10} "
        f"{'IDs/s':>14} {'p50 ms':>7} {'p99 ms':>7} {'pgbench':>7}  ratio claim_blocks / baseline"
    )
    for r in results:
        ratios = "  ".join(f"{k} {v:.2f}x" for k, v in r.ratio_vs.items())
        if r.vs_fresh is not None:
            ratios = f"vs fresh {r.vs_fresh:.1%}  " + ratios
        flag = "  POOL RAN DRY" if r.pool_exhausted else ""
        yield (
            f"{r.method:<15} {r.clients:>7} {r.batch:>5} {r.prior_claims:>9,} "
            f"{r.claims_per_s:>10,.0f} {r.ids_per_s:>14,.0f} {r.p50_ms:>7.2f} "
            f"{r.p99_ms:>7.2f} {r.generator_cpu_share:>7.0%}  {ratios}{flag}"
        )
    targets = document["targets"]
    top = max(plan["clients"])
    yield "(pgbench: the load generator's own share of the machine's CPU time during the run)"
    yield ""
    yield (
        f"targets at {top} clients, batch 1 (reported, not judged): >= "
        f"{targets['vs_skip_locked']:g}x "
        f"skip_locked, >= {targets['vs_segment_update']:g}x segment_update, >= "
        f"{targets['vs_nextval']:g}x nextval, p99 < {targets['p99_ms_below']:g} ms, after prior "
        f"claims >= {targets['prior_vs_fresh']:.0%} of fresh"
    )
    for r in results:
        if r.method != "claim_blocks" or r.clients != top or r.batch != 1:
            continue  # the targets are for single-block claims; batches are shown above
        marks = [
            _mark(f"{k} {v:.2f}x", v >= targets[f"vs_{k}"])
            for k, v in r.ratio_vs.items()
            if f"vs_{k}" in targets
        ]
        marks.append(_mark(f"p99 {r.p99_ms:.2f} ms", r.p99_ms < targets["p99_ms_below"]))
        if r.vs_fresh is not None:
            marks.append(
                _mark(f"vs fresh {r.vs_fresh:.1%}", r.vs_fresh >= targets["prior_vs_fresh"])
            )
        yield f"  claim_blocks batch {r.batch} prior {r.prior_claims:,}: " + ", ".join(marks)
    yield from _ceiling(results, top, targets["vs_nextval"])


def _ceiling(results: list[Result], clients: int, nextval_target: float) -> Iterator[str]:
    """What the reference says about the nextval target: no durable claim beats it."""
    for r in results:
        ratio = r.ratio_vs.get("nextval")
        if r.method != benchclaims.REFERENCE or r.clients != clients or ratio is None:
            continue
        verdict = (
            "so no durable claim can reach the nextval target on this server"
            if ratio < nextval_target
            else "so the nextval target is within reach of a durable claim here"
        )
        yield (
            f"  ceiling: durable_commit (one-row INSERT, no index, synchronous commit) runs "
            f"{r.claims_per_s:,.0f}/s = {ratio:.2f}x nextval, {verdict} "
            f"(target {nextval_target:g}x)"
        )


def _mark(text: str, met: bool) -> str:
    return f"{text} ({'met' if met else 'MISSED'})"

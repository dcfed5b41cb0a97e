"""``allocator bench sustained``: claims a live cluster with its synchronous standby keeps up
with, beside a burst and the durable-commit reference; a thin click wrapper over
:mod:`allocator.bench.sustained`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import click

from allocator.bench import kit
from allocator.bench.sustained import report, runner
from allocator.bench.sustained.plan import Plan
from allocator.commands import options
from allocator.commands.bench import BENCH_CODES, bench, emit, interruptible
from allocator.commands.bench_claims import parse_counts
from allocator.commands.options import SECOND, Duration, exit_codes

DEFAULT_STATE_DIR = Path(".run/bench-sustained")


@bench.command("sustained", epilog=exit_codes(*BENCH_CODES))
@click.option(
    "--clients",
    default="1,8,32",
    show_envvar=True,
    help="Comma-separated pgbench client counts: one sustained run (and one burst) each.",
)
@options.duration_option(
    "--duration",
    kind=Duration(minimum=SECOND, maximum=3600 * SECOND, step=SECOND),
    default=60 * SECOND,
    into="seconds",
    convert=timedelta.total_seconds,
    help="Length of each sustained run, in whole seconds (60s, 2m).",
)
@options.duration_option(
    "--burst-duration",
    kind=Duration(minimum=SECOND, maximum=600 * SECOND, step=SECOND),
    default=15 * SECOND,
    into="burst_seconds",
    convert=timedelta.total_seconds,
    help="Length of each burst and reference run, in whole seconds (15s).",
)
@click.option(
    "--burst/--no-burst",
    default=True,
    show_envvar=True,
    help="Also measure a burst from a pre-filled pool and durable_commit, for the ratios.",
)
@click.option(
    "--burst-age-bound/--no-burst-age-bound",
    default=True,
    show_envvar=True,
    help="Give the burst's database a bound on an ID's age (none of its blocks older), so its "
    "claims take a serving cluster's path (off: bench claims' path without a bound).",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 1000),
    default=1,
    show_envvar=True,
    help="Blocks per claim_blocks call.",
)
@options.state_dir_option(DEFAULT_STATE_DIR)
@options.bench_output_options("bench-sustained")
def sustained(
    clients: str,
    seconds: float,
    burst_seconds: float,
    burst: bool,
    burst_age_bound: bool,
    batch: int,
    state_dir: Path,
    json_out: Path | None,
    as_json: bool,
    keep: bool,
) -> None:
    """Sustained claims/s, IDs/s and p50/p99/p99.9 on a live 3-node cluster with its
    synchronous standby, the pool and the cutter along the run, what limited it, and the
    ratios to a burst and to durable_commit on the same server."""
    plan = Plan(
        clients=parse_counts(clients, "--clients", 500),
        seconds=seconds,
        burst_seconds=burst_seconds,
        batch=batch,
        burst=burst,
        burst_age_bound=burst_age_bound,
    )
    out = json_out or state_dir / f"bench-sustained-{kit.timestamp()}.json"
    with interruptible():
        document = runner.run(plan, state_dir, keep)
    emit(document, out, as_json, report.table(document))

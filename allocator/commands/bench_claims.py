"""``allocator bench claims``: claim_blocks next to SKIP LOCKED, a segment, nextval and the
server's fastest durable commit; a thin click wrapper over :mod:`allocator.bench.claims`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import click

from allocator.bench import kit
from allocator.bench.claims import report, runner
from allocator.bench.claims.plan import Plan
from allocator.commands import options
from allocator.commands.bench import BENCH_CODES, bench, emit, interruptible
from allocator.commands.options import SECOND, Duration, exit_codes

DEFAULT_STATE_DIR = Path(".run/bench-claims")


def parse_counts(text: str, option: str, upper: int) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a list like 1,8,32", param_hint=option) from None
    if not counts or any(not 1 <= count <= upper for count in counts):
        raise click.BadParameter(f"values must be 1..{upper}", param_hint=option)
    return tuple(dict.fromkeys(counts))


@bench.command(
    "claims",
    epilog=exit_codes(*BENCH_CODES),
)
@click.option(
    "--clients",
    default="1,8,32",
    show_envvar=True,
    help="Comma-separated pgbench client counts, one run per method each.",
)
@options.duration_option(
    "--duration",
    kind=Duration(minimum=SECOND, maximum=600 * SECOND, step=SECOND),
    default=10 * SECOND,
    into="seconds",
    convert=timedelta.total_seconds,
    old_flag="--seconds",
    old_unit="s",
    help="Length of each measured run, in whole seconds (10s, 1m).",
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
@click.option(
    "--age-bound/--no-age-bound",
    default=True,
    show_envvar=True,
    help="Keep a bound on an ID's age in force (none of the stocked blocks older), so claims "
    "take a serving cluster's path; off: the path of a database no leader ever served.",
)
@options.database_url_option(
    help="A PostgreSQL superuser URL to bench on. [default: an embedded cluster in --state-dir]"
)
@options.state_dir_option(DEFAULT_STATE_DIR)
@options.bench_output_options("bench-claims")
def claims(
    clients: str,
    seconds: float,
    batch: str,
    prior_claims: int,
    prior_clients: str | None,
    pool_blocks: int,
    age_bound: bool,
    database_url: str | None,
    state_dir: Path,
    json_out: Path | None,
    as_json: bool,
    keep: bool,
) -> None:
    """Claims/s, IDs/s and p50/p99 of claim_blocks and three baselines, driven by pgbench."""
    client_counts = parse_counts(clients, "--clients", 500)
    plan = Plan(
        clients=client_counts,
        seconds=seconds,
        batches=parse_counts(batch, "--batch", 1000),
        prior_claims=prior_claims,
        prior_clients=(
            parse_counts(prior_clients, "--prior-clients", 500)
            if prior_clients
            else (max(client_counts),)
        ),
        pool_blocks=pool_blocks,
        age_bound=age_bound,
    )
    out = json_out or state_dir / f"bench-claims-{kit.timestamp()}.json"
    with interruptible():
        document, results = runner.run(plan, database_url, state_dir, keep)
    emit(document, out, as_json, report.table(document, results))

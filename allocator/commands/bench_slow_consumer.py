"""``allocator bench slow-consumer``: one claim held open across many claims, measured; a thin
click wrapper over :mod:`allocator.bench.slow_consumer`.
"""

from __future__ import annotations

from pathlib import Path

import click

from allocator.bench import kit
from allocator.bench.slow_consumer import report, runner
from allocator.bench.slow_consumer.plan import HEAD, OLD_REVISION, Plan
from allocator.commands import options
from allocator.commands.bench import BENCH_CODES, bench, emit, interruptible
from allocator.commands.options import MILLISECOND, SECOND, Duration, exit_codes
from allocator.core import durations

DEFAULT_STATE_DIR = Path(".run/bench-slow-consumer")


@bench.command(
    "slow-consumer",
    epilog=exit_codes(*BENCH_CODES),
)
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
@options.duration_option(
    "--status-every",
    kind=Duration(maximum=60 * SECOND, step=MILLISECOND),
    default=Plan.status_every_ms * MILLISECOND,
    into="status_every_ms",
    convert=durations.milliseconds,
    old_flag="--status-every-ms",
    old_unit="ms",
    help="Time between two reads of pool_status by the monitoring reader (100ms, 1s).",
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
@options.state_dir_option(DEFAULT_STATE_DIR)
@options.bench_output_options("bench-slow-consumer")
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
        revisions=(HEAD, OLD_REVISION) if compare else (HEAD,),
    )
    out = json_out or state_dir / f"bench-slow-consumer-{kit.timestamp()}.json"
    with interruptible():
        document, results = runner.run(plan, database_url, state_dir, keep)
    emit(document, out, as_json, report.table(document, results))

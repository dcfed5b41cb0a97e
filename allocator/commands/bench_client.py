"""``allocator bench client``: IdClient's throughput and latency against a real pool; a thin
click wrapper over :mod:`allocator.bench.client`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import click

from allocator.bench import kit
from allocator.bench.client import report, runner
from allocator.bench.client.runner import DEFAULT_POOL_BLOCKS
from allocator.client.base import DEFAULT_REFILL_AT, MAX_BATCH_BLOCKS
from allocator.commands import options
from allocator.commands.bench import BENCH_CODES, bench, emit, interruptible
from allocator.commands.options import SECOND, Duration, exit_codes
from allocator.commands.ranges import FiniteFloatRange

DEFAULT_STATE_DIR = Path(".run/bench")


@bench.command(
    "client",
    epilog=exit_codes(*BENCH_CODES),
)
@options.database_url_option(
    help="A running allocator's database (role granted allocator_consumer). "
    "[default: an embedded cluster in --state-dir]"
)
@options.state_dir_option(DEFAULT_STATE_DIR)
@options.duration_option(
    "--duration",
    kind=Duration(minimum=SECOND / 10, maximum=600 * SECOND),
    default=5 * SECOND,
    into="seconds",
    convert=timedelta.total_seconds,
    old_flag="--seconds",
    old_unit="s",
    help="Length of each run (5s, 500ms).",
)
@click.option(
    "--threads",
    default="1,4",
    show_envvar=True,
    help="Comma-separated thread counts, one throughput run each.",
)
@click.option(
    "--batch-blocks",
    type=click.IntRange(1, MAX_BATCH_BLOCKS),
    default=64,
    show_envvar=True,
    help="Blocks per claim (the client's segment).",
)
@click.option(
    "--max-batch-blocks",
    type=click.IntRange(1, MAX_BATCH_BLOCKS),
    default=256,
    show_envvar=True,
    help="Upper bound the client may grow its claims to when a prefetch comes too late.",
)
@click.option(
    "--refill-at",
    type=FiniteFloatRange(0.0, 1.0, min_open=True),
    default=DEFAULT_REFILL_AT,
    show_envvar=True,
    help="Fraction of a segment left when the next one is claimed.",
)
@click.option(
    "--pool-blocks",
    type=click.IntRange(1, 100_000),
    default=DEFAULT_POOL_BLOCKS,
    show_envvar=True,
    help="Pool level to wait for before measuring (and the embedded node's pool.min_blocks).",
)
@options.bench_output_options("bench-client")
def client(
    database_url: str | None,
    state_dir: Path,
    seconds: float,
    threads: str,
    batch_blocks: int,
    max_batch_blocks: int,
    refill_at: float,
    pool_blocks: int,
    json_out: Path | None,
    as_json: bool,
    keep: bool,
) -> None:
    """IDs/s of IdClient.next_id() on 1 and 4 threads, and its latency across block boundaries."""
    thread_counts = _parse_threads(threads)
    if max_batch_blocks < batch_blocks:
        raise click.BadParameter("must be >= --batch-blocks", param_hint="--max-batch-blocks")
    batch = (batch_blocks, max_batch_blocks)
    out = json_out or state_dir / f"bench-client-{kit.timestamp()}.json"
    with interruptible():
        document, results, latency = runner.run(
            database_url,
            state_dir,
            keep,
            seconds=seconds,
            thread_counts=thread_counts,
            batch=batch,
            refill_at=refill_at,
            pool_blocks=pool_blocks,
        )
    emit(document, out, as_json, report.table(document, results, latency))


def _parse_threads(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a list like 1,4", param_hint="--threads"
        ) from None
    if not counts or any(not 1 <= count <= 256 for count in counts):
        raise click.BadParameter("thread counts must be 1..256", param_hint="--threads")
    return counts

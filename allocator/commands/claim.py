"""``allocator claim``: claim ID blocks from a shell or a script, in one SQL call, as the
application's login role (docs/design.md §7). The exit codes are the command's epilog.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from allocator import config as config_mod
from allocator.client import claim_once
from allocator.client.base import MAX_BATCH_BLOCKS, check_consumer
from allocator.commands import options
from allocator.commands.options import CONFIG, OTHER, USAGE, config_options, exit_codes
from allocator.core.errors import ConfigError
from allocator.core.exits import Exit
from allocator.local.client_env import CLAIM_URL_ENV

# The URL is the application's: a login role granted allocator_consumer (allocator_app in
# the embedded cluster and the compose kit), never the config's postgres.url, the nodes' role,
# which may not call claim_blocks. With none given, claim is a configuration error (78).
NO_URL = (
    f"no database URL for claim: set {CLAIM_URL_ENV} (or {CLAIM_URL_ENV}_FILE), or pass "
    "--database-url or --database-url-file, with a login role granted allocator_consumer "
    "(`allocator local env` exports it for the embedded cluster); the nodes' postgres.url "
    "is not used, since their role may not call claim_blocks"
)


@click.command(
    "claim",
    epilog=exit_codes(
        (
            Exit.OK,
            "claimed at least one block (fewer than --count when the pool ran short: a note)",
        ),
        (Exit.USAGE, "a consumer name the database refuses (AL001/AL002)"),
        USAGE,
        (
            Exit.TEMPFAIL,
            "the pool is empty (AL003), claims are paused (AL004) or PostgreSQL is "
            "unreachable: retry later",
        ),
        CONFIG,
        (Exit.CONFIG, "no application URL"),
        OTHER,
    ),
)
@click.option(
    "--consumer",
    required=True,
    show_envvar=True,
    help="Name the blocks are claimed for (1..128 characters, no control characters).",
)
@click.option(
    "--count",
    type=click.IntRange(1, MAX_BATCH_BLOCKS),
    default=1,
    show_envvar=True,
    help="Blocks to claim in one call; fewer come back when the pool runs short.",
)
@click.option("--json", "as_json", is_flag=True, show_envvar=True, help="Print one JSON object.")
@options.database_url_option(
    help="PostgreSQL URL of the application's login role (granted allocator_consumer). "
    "Required: the nodes' postgres.url is not used."
)
@config_options
def claim(
    consumer: str,
    count: int,
    as_json: bool,
    database_url: str | None,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> None:
    """Claim COUNT ID blocks for CONSUMER and print them (exit 75 when the pool is empty)."""
    check_consumer(consumer)
    if not database_url:
        raise ConfigError(NO_URL)
    # The application's URL replaces the nodes' for this command: checked by the same rules;
    # the configuration (file, ALLOCATOR_*, --set) still gives the timeouts.
    config = config_mod.load_from_options(config_path, set_pairs, {"postgres.url": database_url})
    # One claim_blocks call on a short-lived connection: the blocks are durably claimed when it
    # returns and belong to the consumer for good (nothing hands them back).
    blocks = claim_once(
        config.postgres.url.get_secret_value(),
        consumer,
        count,
        connect_timeout_s=config.postgres.connect_timeout_s,
        statement_timeout_ms=config.postgres.statement_timeout_ms,
        application_name="allocator-claim",
    )
    if as_json:
        document = {
            "consumer": consumer,
            "requested": count,
            "blocks": [block.to_json() for block in blocks],
        }
        click.echo(json.dumps(document))
    else:
        for block in blocks:  # oldest first; first_id and last_id inclusive
            click.echo(f"{block.block_id} {block.first_id} {block.last_id}")
    if len(blocks) < count:
        click.echo(f"note: claimed {len(blocks)} of {count} blocks: the pool ran short", err=True)

"""``allocator fence rebase`` and ``allocator fence status``: the operator's side of the fence
(docs/design.md §3). The procedure is :mod:`allocator.fence.rebase`; this module parses the
options, asks on a terminal and prints.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from allocator import config as config_mod
from allocator import fence
from allocator.cluster_status import gather_fence
from allocator.commands import options
from allocator.commands.options import CONFIG, OTHER, UNREACHABLE, USAGE, config_options, exit_codes
from allocator.core.audit import check_reason
from allocator.core.exits import Exit
from allocator.fence.rebase import (
    DatabaseWentBackError,
    Plan,
    describe_plan,
    outcome_lines,
    rebase,
)


def _confirm(plan: Plan) -> bool:
    """The plan on stderr, then the question on the terminal."""
    for line in describe_plan(plan):
        click.echo(line, err=True)
    return click.confirm("Re-base the fence?", default=False, err=True)


@click.group("fence", epilog=exit_codes(*options.GROUP_CODES))
def fence_group() -> None:
    """The fencing token: re-base it after a ZooKeeper rebuild, or show it."""


@fence_group.command(
    "rebase",
    epilog=exit_codes(
        (Exit.OK, "done (what changed is printed)"),
        (Exit.FAILED, "cancelled at the prompt; or the database was restored, not the ensemble"),
        OTHER,
        (Exit.USAGE, "no --yes and no terminal to ask on; an empty or too long --reason (AL106)"),
        USAGE,
        UNREACHABLE,
        CONFIG,
        (
            DatabaseWentBackError.exit_code,
            "the database went backwards (below ZooKeeper's watermark): run `allocator pool "
            "reset --after-restore` instead",
        ),
    ),
)
@options.audited_options("allocator.fence_history")
def rebase_command(
    reason: str,
    yes: bool,
    as_json: bool,
    database_url: str | None,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> None:
    """Advance the fence generation after a ZooKeeper ensemble was wiped or restored.

    Database first (audited), then the generation znode beside the election path.
    Refuses a database below ZooKeeper's watermark (restored, or failed over with lost
    commits): that one needs `allocator pool reset --after-restore`.
    """
    # Both before anything connects: the reason (1..1000 characters, not only blanks), and
    # --yes or a terminal to ask on once the plan is shown.
    check_reason(reason, "the fence is re-based")
    options.check_confirmable(yes, "fence rebase changes the token every node is checked against")
    # A login role granted allocator_operator, which the audit records.
    flags = {"postgres.url": database_url} if database_url else {}
    config = config_mod.load_from_options(config_path, set_pairs, flags)
    url = config.postgres.url.get_secret_value()
    outcome = rebase(config, url, reason, None if yes else _confirm)
    if as_json:
        click.echo(json.dumps(outcome.to_json(), indent=2))
        return
    for line in outcome_lines(outcome):
        click.echo(line)


@fence_group.command(
    "status",
    epilog=exit_codes(
        (Exit.OK, "printed (a fence ahead of ZooKeeper is a line of it, not an exit)"),
        USAGE,
        UNREACHABLE,
        CONFIG,
        OTHER,
    ),
)
@click.option("--json", "as_json", is_flag=True, show_envvar=True, help="Print one JSON object.")
@options.database_url_option(
    help="PostgreSQL URL (operator or node role). [default: config postgres.url]"
)
@config_options
def status_command(
    as_json: bool, database_url: str | None, config_path: Path | None, set_pairs: tuple[str, ...]
) -> None:
    """The database's fence, ZooKeeper's generation and newest zxid, and the last re-bases."""
    from allocator.commands.status import fence_lines

    flags = {"postgres.url": database_url} if database_url else {}
    config = config_mod.load_from_options(config_path, set_pairs, flags)
    report = gather_fence(config)
    data = report.to_json()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    for line in fence_lines(data):
        click.echo(line)
    ahead = data["ahead_of_zookeeper"]
    click.echo(f"ahead       {'unknown' if ahead is None else 'YES' if ahead else 'no'}")
    click.echo("re-bases" + ("" if data["rebases"] else "    none"))
    for record in report.rebases or []:
        click.echo(
            f"  #{record.rebase_id} {record.rebased_at:%Y-%m-%d %H:%M:%S%z} by "
            f"{record.rebased_by}: {fence.Token(record.old_generation, record.old_epoch)} -> "
            f"generation {record.new_generation}: {record.reason}"
        )

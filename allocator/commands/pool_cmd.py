"""``allocator pool``: pause and resume claims (:mod:`allocator.pool.pause`, migration 0010), and
reset the pool after a restore (:mod:`allocator.pool.reset`). ``--reason`` and the reset's
options are typed each time, never read from the environment: a variable left from an earlier
incident would record the wrong why or name the wrong database.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from allocator import config as config_mod
from allocator.commands import options
from allocator.commands.options import (
    CONFIG,
    OTHER,
    SECOND,
    UNREACHABLE,
    USAGE,
    Duration,
    exit_codes,
)
from allocator.config import Config
from allocator.core import durations, redact
from allocator.core.audit import check_reason
from allocator.core.errors import UsageError
from allocator.core.exits import Exit
from allocator.pool import pause as claim_pause
from allocator.pool.reset import check_old_database, outcome_lines, reset


def _confirm(plan: list[str]) -> bool:
    """The plan on stderr, then the question on the terminal."""
    for line in plan:
        click.echo(line, err=True)
    return click.confirm("Reset the pool?", default=False, err=True)


@click.group("pool", epilog=exit_codes(*options.GROUP_CODES))
def pool_group() -> None:
    """The pool of cut blocks: pause and resume claims, reset it after a database restore."""


def _operator_url(
    database_url: str | None, config_path: Path | None, set_pairs: tuple[str, ...]
) -> tuple[Config, str]:
    """The configuration and the operator role's URL (``--database-url`` wins)."""
    flags = {"postgres.url": database_url} if database_url else {}
    config = config_mod.load_from_options(config_path, set_pairs, flags)
    return config, config.postgres.url.get_secret_value()


def pause_json(done: claim_pause.Paused) -> dict[str, Any]:
    """``pool pause --json``'s object."""
    p = done.pause
    return {
        "pause_id": p.pause_id,
        "paused_at": p.paused_at.isoformat(),
        "paused_by": p.paused_by,
        "reason": p.reason,
        "already_paused": p.already_paused,
        "waited_for": [
            {
                "pid": c.pid,
                "usename": c.usename,
                "application_name": c.application_name,
                "client_addr": c.client_addr,
                "state": c.state,
                "xact_start": c.xact_start.isoformat() if c.xact_start else None,
            }
            for c in done.waited_for
        ],
        "waited_s": round(done.waited_s, 3),
    }


def pause_lines(done: claim_pause.Paused) -> list[str]:
    """``pool pause``'s text: the pause, and the claims it waited for."""
    p = done.pause
    since = p.paused_at.isoformat(timespec="seconds")
    first = (
        f"claims were already paused (pause {p.pause_id}, since {since} by {p.paused_by}: "
        f"{p.reason}); nothing changed"
        if p.already_paused
        else f"claims paused (pause {p.pause_id}, {since} by {p.paused_by}): {p.reason}"
    )
    count = len(done.waited_for)
    waited = (
        f"waited {done.waited_s:.1f} s for {count} claim(s) in flight to end: "
        + "; ".join(c.describe() for c in done.waited_for)
        if count
        else "no claim was in flight"
    )
    return [
        first,
        waited,
        "every claim begun before the pause has ended; claim_blocks answers AL004 until "
        "`allocator pool resume`",
    ]


@pool_group.command(
    "pause",
    epilog=exit_codes(
        (Exit.OK, "claims are paused and no claim begun before the pause is still open"),
        OTHER,
        USAGE,
        (
            Exit.TEMPFAIL,
            "PostgreSQL unreachable; or claims are paused but claims begun before the pause "
            "were still open at --timeout (each is named)",
        ),
        CONFIG,
    ),
)
@click.option(
    "--timeout",
    type=Duration(maximum=3600 * SECOND, bare_unit="s"),
    default=durations.format_duration(timedelta(seconds=claim_pause.DEFAULT_TIMEOUT_S)),
    show_default=True,
    help="How long to wait for the claims in flight to end (the default outlasts "
    "claim_blocks' 60 s idle bound; a bare number of seconds is deprecated).",
)
@options.audited_options("allocator.claim_pause_history", confirm=False)
def pause_command(
    timeout: timedelta,
    reason: str,
    as_json: bool,
    database_url: str | None,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> None:
    """Pause claims (AL004) and wait until every claim in flight has ended."""
    # No --yes: a pause takes nothing away that resume does not give back, and an operator
    # who pauses in an incident wants it now. The pause is committed (and audited) first; a
    # timeout (exit 75, naming the sessions still claiming) leaves it in force.
    check_reason(reason, "claims are paused")
    config, url = _operator_url(database_url, config_path, set_pairs)
    done = claim_pause.pause(
        url, reason, timeout.total_seconds(), connect_timeout_s=config.postgres.connect_timeout_s
    )
    if as_json:
        click.echo(json.dumps(pause_json(done), indent=2))
        return
    for line in pause_lines(done):
        click.echo(line)


@pool_group.command(
    "resume",
    epilog=exit_codes(
        (Exit.OK, "claims are served (also when they were not paused)"),
        OTHER,
        USAGE,
        UNREACHABLE,
        CONFIG,
    ),
)
@options.audited_options("allocator.claim_pause_history", confirm=False)
def resume_command(
    reason: str,
    as_json: bool,
    database_url: str | None,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> None:
    """Resume claims paused by `pool pause` or by `pool reset --after-restore`."""
    check_reason(reason, "claims are resumed")
    config, url = _operator_url(database_url, config_path, set_pairs)
    done = claim_pause.resume(url, reason, connect_timeout_s=config.postgres.connect_timeout_s)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "was_paused": done.was_paused,
                    "pause_id": done.pause_id,
                    "paused_at": done.paused_at.isoformat() if done.paused_at else None,
                    "paused_by": done.paused_by,
                    "reason": done.reason,
                    "resumed_at": done.resumed_at.isoformat() if done.resumed_at else None,
                    "resumed_by": done.resumed_by,
                    "resume_reason": done.resume_reason,
                },
                indent=2,
            )
        )
    elif done.was_paused:
        click.echo(
            f"claims resumed (pause {done.pause_id} by {done.paused_by}: {done.reason}); "
            "claim_blocks hands out blocks again"
        )
    else:
        click.echo("claims were not paused; nothing changed")


@pool_group.command(
    "reset",
    epilog=exit_codes(
        (Exit.OK, "done (what changed is printed); claims stay paused until `pool resume`"),
        (
            Exit.FAILED,
            "cancelled at the prompt; the old database's claims are not paused, or claims "
            "begun before its pause are still open",
        ),
        OTHER,
        (
            Exit.USAGE,
            "no --after-restore, no --yes and no terminal, a bad --reason, neither or both "
            "of --old-database-url and --old-database-unreachable, or the old database is the "
            "one reset",
        ),
        USAGE,
        UNREACHABLE,
        CONFIG,
    ),
)
@options.typed_option(
    "--after-restore",
    is_flag=True,
    help="Required: the database was restored from a backup or failed over to a standby "
    "that missed commits.",
)
@options.typed_option(
    "--old-database-url",
    default=None,
    help="PostgreSQL URL (operator role) of the database that served until the restore, its "
    "claims paused: its mark, read now, is a floor of the new mark. No password in it: "
    "use PGPASSWORD or a PGPASSFILE.",
)
@options.typed_option(
    "--old-database-unreachable",
    is_flag=True,
    help="The old database cannot be read (down, lost, or restored in place): the mark rests "
    "on the watermark and this server's clock (docs/postgres-ha.md).",
)
@options.audited_options("allocator.pool_resets")
def reset_command(
    after_restore: bool,
    old_database_url: str | None,
    old_database_unreachable: bool,
    reason: str,
    yes: bool,
    as_json: bool,
    database_url: str | None,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> None:
    """Void every unclaimed block, move the mark and advance the fence after a restore."""
    if not after_restore:  # required so that the command says what it is for where it is typed
        raise UsageError("pool reset needs --after-restore (the only reset there is)")
    check_reason(reason, "the pool is reset")
    if old_database_url and redact.carries_secret(old_database_url):
        raise UsageError(
            "--old-database-url must not carry a password on the command line (every process "
            "list shows it): leave it out and give it through PGPASSWORD or a PGPASSFILE"
        )
    config, url = _operator_url(database_url, config_path, set_pairs)
    check_old_database(url, old_database_url, old_database_unreachable)
    options.check_confirmable(yes, "pool reset voids every unclaimed block and moves the mark")
    outcome = reset(
        config, url, reason, old_url=old_database_url, confirm=None if yes else _confirm
    )
    if as_json:
        click.echo(json.dumps(outcome.to_json(), indent=2))
        return
    for line in outcome_lines(outcome):
        click.echo(line)

"""``allocator migrate``: move the database schema to the newest revision (idempotent) or
to a given one, as a role allowed to create the schema and roles: a superuser, or a
CREATEROLE login that is (or may become) a member of ``allocator_owner`` (docs/sql.md,
"Who runs the migrations"); never ``allocator_node``. Every run holds the migration lock,
so two runs take turns; ``--status`` reports what nodes of this release make of the schema
(docs/upgrades.md).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from allocator import config as config_mod
from allocator.commands import options
from allocator.commands.options import (
    CONFIG,
    OTHER,
    SECOND,
    UNREACHABLE,
    USAGE,
    Duration,
    config_options,
    exit_codes,
)
from allocator.core import durations
from allocator.core.errors import UsageError
from allocator.core.exits import Exit

if TYPE_CHECKING:
    from allocator.postgres.compat import SchemaStamp

DEFAULT_LOCK_TIMEOUT = timedelta(seconds=60)
COMMANDLINE = ParameterSource.COMMANDLINE


@click.command(
    "migrate",
    epilog=exit_codes(
        (Exit.OK, "the schema is at the revision asked for (or removed: --to base); --status"),
        (Exit.FAILED, "--check: the schema is behind; a migration failed (the database says why)"),
        OTHER,
        (Exit.USAGE, "an unknown revision (the known ones named); a move down without --yes"),
        USAGE,
        (Exit.TEMPFAIL, "another migration held the lock past --lock-timeout (its pid named)"),
        UNREACHABLE,
        CONFIG,
    ),
)
@options.database_url_option(help="PostgreSQL URL of the schema owner (overrides postgres.url).")
@options.typed_option(
    "--to",
    "target",
    default="head",
    help="head: the newest schema; a revision (e.g. 0011): up or down to it; base: remove "
    "the allocator schema. Moving down drops what the revisions above added: needs --yes.",
)
@options.typed_option("--yes", is_flag=True, help="Confirm a move down (to base or a revision).")
@click.option("--check", is_flag=True, help="Only report; exit 1 when the schema is behind.")
@click.option(
    "--status",
    is_flag=True,
    help="Only report: the revision, this release's head, the pending revisions and whether "
    "nodes of this release can use the schema.",
)
@click.option(
    "--lock-timeout",
    type=Duration(maximum=3600 * SECOND),
    default=durations.format_duration(DEFAULT_LOCK_TIMEOUT),
    show_default=True,
    show_envvar=True,
    help="How long to wait for another migration's lock before giving up (exit 75).",
)
@options.json_option(help="Print one JSON object.")
@config_options
def migrate_command(
    database_url: str | None,
    target: str,
    yes: bool,
    check: bool,
    status: bool,
    lock_timeout: timedelta,
    as_json: bool,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> None:
    """Apply the schema migrations (default: upgrade to the newest revision)."""
    from allocator.postgres import compat, migrate

    # --database-url (or its variable, or --database-url-file) wins over postgres.url.
    flags = {"postgres.url": database_url} if database_url else {}
    url = config_mod.load_from_options(config_path, set_pairs, flags).postgres.url
    url_text = url.get_secret_value()
    head = migrate.head_revision()
    known = migrate.known_revisions()
    ctx = click.get_current_context()
    if check or status:
        moved = any(ctx.get_parameter_source(f) is COMMANDLINE for f in ("target", "yes"))
        if moved or (check and status):
            raise UsageError("--check and --status only report: give one, without --to or --yes")
        stamp = migrate.read_stamp(url_text)
        if status:
            _status(as_json, stamp, known)
            return
        current = stamp.revision
        text = f"schema revision: {current or 'none'} (newest: {head})"
        newer = current is not None and current not in known
        _report(as_json, text, "check", current, current, head, newer=newer)
        raise SystemExit(Exit.OK if current == head or newer else Exit.FAILED)
    if target not in ("head", "base", *known):
        raise UsageError(
            f"--to {target!r}: not a revision this release knows (head, base, {', '.join(known)})"
        )
    before = None if target in ("head", "base") else migrate.current_revision(url_text)
    if _moves_down(target, before, known) and not yes:
        if target == "base":
            raise UsageError("--to base drops every block and the fence; add --yes to confirm")
        raise UsageError(
            f"--to {target} moves the schema down from {before} and drops what the revisions "
            "above it added (docs/upgrades.md); add --yes to confirm"
        )
    timeout_s = lock_timeout.total_seconds()
    before, after = migrate.migrate_to(url_text, target, timeout_s)
    if target == "base":
        _report(as_json, "allocator schema removed", "downgrade", before, None, head)
        return
    verdict = compat.judge(compat.SchemaStamp(after, compat.marker(after)))
    if before == after:
        newer = after is not None and after not in known
        text = (
            f"schema at revision {after}, newer than this release knows ({head}): left alone"
            if newer
            else f"schema already at revision {after}"
        )
        action = "upgrade"  # nothing to do, as before: the schema is where it was asked to be
    elif _moves_down(target, before, known):
        text, action = f"schema downgraded from {before} to revision {after}", "downgrade"
    else:
        text, action = f"schema upgraded from {before or 'nothing'} to revision {after}", "upgrade"
    if not verdict.usable:
        text += f" (nodes of this release cannot use it: {verdict.message})"
    _report(as_json, text, action, before, after, head, newer=after not in (None, *known))


def _moves_down(target: str, current: str | None, known: list[str]) -> bool:
    """Whether ``--to target`` from ``current`` is a downgrade (it drops things)."""
    if target == "base":
        return True
    if target == "head" or current is None or current not in known:
        return False
    return known.index(target) < known.index(current)


def _status(as_json: bool, stamp: SchemaStamp, known: list[str]) -> None:
    """``--status``: the revision, the head, what is pending, and the nodes' verdict."""
    from allocator.postgres import compat

    current, head = stamp.revision, known[-1]
    newer = current is not None and current not in known
    start = 0 if current is None or newer else known.index(current) + 1
    pending = [] if newer else known[start:]
    verdict = compat.judge(stamp)
    if as_json:
        document = {
            "action": "status",
            "current_revision": current,
            "head_revision": head,
            "pending_revisions": pending,
            "newer_than_head": newer,
            "up_to_date": current == head or newer,
            "min_node_revision": stamp.min_node_revision,
            "nodes_can_use": verdict.usable,
            "nodes_verdict": verdict.message,
        }
        click.echo(json.dumps(document))
        return
    click.echo(f"schema revision: {current or 'none'}")
    click.echo(f"this release's head: {head}")
    click.echo(f"pending: {' '.join(pending) if pending else 'none'}")
    answer = "yes" if verdict.usable else "no"
    click.echo(f"nodes of this release can use it: {answer} ({verdict.message})")


def _report(
    as_json: bool,
    text: str,
    action: str,
    previous: str | None,
    current: str | None,
    head: str,
    *,
    newer: bool = False,
) -> None:
    """One line, or one JSON object: ``action`` (check, upgrade, downgrade), the previous,
    current and head revisions, and ``up_to_date`` (also true for a revision ``newer`` than
    this release knows: nothing of it is pending)."""
    if not as_json:
        click.echo(text)
        return
    document = {
        "action": action,
        "previous_revision": previous,
        "current_revision": current,
        "head_revision": head,
        "up_to_date": current == head or newer,
    }
    click.echo(json.dumps(document))

"""``allocator migrate``: bring the database schema to the newest revision (idempotent), as a
role allowed to create the schema and roles: a superuser, or a CREATEROLE login that is (or
may become) a member of ``allocator_owner`` (docs/sql.md, "Who runs the migrations"); never
``allocator_node``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from allocator import config as config_mod
from allocator.commands import options
from allocator.commands.options import CONFIG, OTHER, UNREACHABLE, USAGE, config_options, exit_codes
from allocator.core.errors import UsageError
from allocator.core.exits import Exit


@click.command(
    "migrate",
    epilog=exit_codes(
        (Exit.OK, "the schema is at the newest revision (or removed: --to base)"),
        (Exit.FAILED, "--check: the schema is behind; a migration failed (the database says why)"),
        OTHER,
        (Exit.USAGE, "--to base without --yes"),
        USAGE,
        UNREACHABLE,
        CONFIG,
    ),
)
@options.database_url_option(help="PostgreSQL URL of the schema owner (overrides postgres.url).")
@options.typed_option(
    "--to",
    "target",
    type=click.Choice(["head", "base"]),
    default="head",
    help="head: newest schema; base: remove the allocator schema (needs --yes).",
)
@options.typed_option("--yes", is_flag=True, help="Confirm a downgrade to base.")
@click.option("--check", is_flag=True, help="Only report; exit 1 when the schema is behind.")
@options.json_option(help="Print one JSON object.")
@config_options
def migrate_command(
    database_url: str | None,
    target: str,
    yes: bool,
    check: bool,
    as_json: bool,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> None:
    """Apply the schema migrations (default: upgrade to the newest revision)."""
    from allocator.postgres import migrate

    # --database-url (or its variable, or --database-url-file) wins over postgres.url.
    flags = {"postgres.url": database_url} if database_url else {}
    url = config_mod.load_from_options(config_path, set_pairs, flags).postgres.url
    url_text = url.get_secret_value()
    head = migrate.head_revision()
    if check:
        current = migrate.current_revision(url_text)
        text = f"schema revision: {current or 'none'} (newest: {head})"
        _report(as_json, text, "check", current, current, head)
        raise SystemExit(Exit.OK if current == head else Exit.FAILED)
    if target == "base":  # --to and --yes are typed options: ALLOCATOR_MIGRATE_YES does nothing
        if not yes:
            raise UsageError("--to base drops every block and the fence; add --yes to confirm")
        before = migrate.current_revision(url_text)
        migrate.downgrade_to_base(url_text)
        _report(as_json, "allocator schema removed", "downgrade", before, None, head)
        return
    before = migrate.current_revision(url_text)
    migrate.upgrade_to_head(url_text)
    if before == head:
        text = f"schema already at revision {head}"
    else:
        text = f"schema upgraded from {before or 'nothing'} to revision {head}"
    _report(as_json, text, "upgrade", before, head, head)


def _report(
    as_json: bool, text: str, action: str, previous: str | None, current: str | None, head: str
) -> None:
    """One line, or one JSON object: ``action`` (check, upgrade, downgrade), the previous,
    current and head revisions, and ``up_to_date``."""
    if not as_json:
        click.echo(text)
        return
    document = {
        "action": action,
        "previous_revision": previous,
        "current_revision": current,
        "head_revision": head,
        "up_to_date": current == head,
    }
    click.echo(json.dumps(document))

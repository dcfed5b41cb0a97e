"""``allocator migrate``: bring the database schema to the newest revision.

Rules: the database URL is the config's ``postgres.url`` (file, ``ALLOCATOR_POSTGRES_URL``),
or ``--database-url`` / ``ALLOCATOR_MIGRATE_DATABASE_URL`` / ``--database-url-file``, which
win; it must be a role allowed to create the schema and roles: a superuser, or a CREATEROLE
login that is (or may become) a member of ``allocator_owner``, the NOLOGIN role that owns the
schema (docs/sql.md, "Who runs the migrations"); never ``allocator_node``. A URL with a
password is refused on the command line (see :mod:`allocator.commands.options`). Upgrading
is idempotent. Going down to ``base`` drops every block and the fence, so it needs ``--yes``;
neither ``--to`` nor ``--yes`` is ever read from the environment (``ALLOCATOR_MIGRATE_YES=1``
does nothing).
"""

from __future__ import annotations

from pathlib import Path

import click

from allocator import config as config_mod
from allocator.commands import options
from allocator.errors import UsageError


@click.command("migrate")
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
@config_mod.config_options
def migrate_command(
    database_url: str | None,
    target: str,
    yes: bool,
    check: bool,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> None:
    """Apply the schema migrations (default: upgrade to the newest revision)."""
    from allocator import migrate  # alembic is slow to import; only this command needs it

    flags = {"postgres.url": database_url} if database_url else {}
    url = config_mod.load_from_options(config_path, set_pairs, flags).postgres.url
    url_text = url.get_secret_value()
    head = migrate.head_revision()
    if check:
        current = migrate.current_revision(url_text)
        click.echo(f"schema revision: {current or 'none'} (newest: {head})")
        raise SystemExit(0 if current == head else 1)
    if target == "base":
        if not yes:
            raise UsageError("--to base drops every block and the fence; add --yes to confirm")
        migrate.downgrade_to_base(url_text)
        click.echo("allocator schema removed")
        return
    before = migrate.current_revision(url_text)
    migrate.upgrade_to_head(url_text)
    if before == head:
        click.echo(f"schema already at revision {head}")
    else:
        click.echo(f"schema upgraded from {before or 'nothing'} to revision {head}")

"""The ``allocator`` console script.

Rules: one click group; each command lives in ``allocator.commands.<name>`` and is
registered here. Errors derived from :class:`allocator.errors.AllocatorError` print one line
(``error: <message>: <cause>``) on stderr and exit with the error's code; no tracebacks for
expected failures. Every option that matters in production can also be set through an
``ALLOCATOR_*`` environment variable (``auto_envvar_prefix``), shown in ``--help``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from allocator import __version__, errors

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class _Group(click.Group):
    """A click group that turns AllocatorError into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except errors.AllocatorError as exc:
            click.echo(f"error: {errors.describe(exc)}", err=True)
            for line in errors.details(exc):
                click.echo(f"  | {line}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"auto_envvar_prefix": "ALLOCATOR", "show_default": True})
@click.version_option(__version__, prog_name="allocator")
def main() -> None:
    """Leader-elected allocator of Snowflake ID blocks."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)


def _register() -> None:
    from allocator.commands import COMMANDS

    for command in COMMANDS:
        main.add_command(command)


_register()

if __name__ == "__main__":
    main()

"""The ``allocator`` console script: one click group; each command lives in
``allocator.commands.<name>`` and is registered here.

Every option that matters in production can also be set through an ``ALLOCATOR_*``
environment variable (``ALLOCATOR_<COMMAND>_<OPTION>``), shown in ``--help``, except the
dangerous choices, which a person types each time
(:func:`allocator.commands.options.typed_option`; a unit test holds this list to the
commands): ``--yes`` (``migrate``, ``fence rebase``, ``pool reset``), ``migrate --to``,
``fence rebase --reason``, ``pool reset --reason``, ``pool pause --reason`` and ``pool
resume --reason`` (the audit record's why), ``pool reset --after-restore``, ``pool reset
--old-database-url`` and ``pool reset --old-database-unreachable`` (which bound protects the
IDs), ``local down --purge`` and ``local up --node-command`` (what runs as a node).

No option carries a secret: a ``--database-url`` whose URL holds a password is refused (a
command line shows in every process list); the URL then comes from the command's
``ALLOCATOR_<COMMAND>_DATABASE_URL``, a file (``--database-url-file``) or the config's
``postgres.url``, or the password from libpq's ``PGPASSWORD`` / ``PGPASSFILE``. ``--set``
refuses the secret keys, and ``local up --node-env`` refuses secret variables.
"""

from __future__ import annotations

import io
import logging
import sys
import traceback
from typing import Any

import click

from allocator import DISTRIBUTION, VERSION_MESSAGE, __version__
from allocator.commands.options import exit_table
from allocator.core import errors, logs, redact
from allocator.core.exits import Exit


def one_line(text: str) -> str:
    """``text`` with line breaks and control characters escaped (``\\n``, ``\\x1b``): an error
    that quotes a bad argument stays one line and cannot drive the terminal."""
    return "".join(ch if ch.isprintable() or ch == "\t" else ascii(ch)[1:-1] for ch in text)


class _Group(click.Group):
    """A click group that turns AllocatorError into one line and an exit code.

    Exit codes are the one table's (:mod:`allocator.core.exits`, printed by ``allocator
    --help``; every command's ``--help`` ends with its own). An :class:`AllocatorError`
    prints ``error: <message>: <cause>`` on stderr and exits with its code; click's usage
    errors exit 64 like ours; an unexpected exception (a bug) prints its traceback and exits
    70; a reader that goes away (``allocator status | head``) is no bug: click ends quietly
    (exit 1). Every error line is one line (:func:`one_line`) with its secrets masked
    (:mod:`allocator.core.redact`), click's usage errors and a bug's traceback included.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """The group's own options: a usage error as one masked line, exit 64."""
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:  # the group's own options: one line too
            _exit_with_usage_code(exc)
            safe = one_line(redact.redact(exc.format_message()))
            if safe == exc.format_message() or _is_help(exc):
                raise
            raise _usage_error(safe, exc.ctx) from None

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; its errors leave as one masked line and the table's code."""
        try:
            return super().invoke(ctx)
        except errors.AllocatorError as exc:
            click.echo(f"error: {one_line(errors.describe(exc))}", err=True)
            for line in errors.details(exc):
                click.echo(f"  | {one_line(line)}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            # A usage error may quote the bad value, which may hold a secret, or a line break.
            message = exc.format_message()
            safe = one_line(redact.redact(message))
            if isinstance(exc, click.UsageError):
                _exit_with_usage_code(exc)
            if safe == message or _is_help(exc):
                raise
            if isinstance(exc, click.UsageError):
                raise _usage_error(safe, exc.ctx) from None
            raise click.ClickException(safe) from None
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:
            raise  # the reader went away (`| head`): click ends quietly (exit 1), not a bug
        except Exception:
            # A bug: the traceback helps, but a driver's message in it may echo a secret.
            click.echo(redact.redact(traceback.format_exc()).rstrip(), err=True)
            sys.exit(Exit.SOFTWARE)


def _usage_error(message: str, ctx: click.Context | None) -> click.UsageError:
    """click's usage error with ``message``, exiting with the table's usage code."""
    error = click.UsageError(message, ctx=ctx)
    _exit_with_usage_code(error)
    return error


def _is_help(error: click.ClickException) -> bool:
    """A group called without a command: click prints its help (not one error line)."""
    no_args = getattr(click.exceptions, "NoArgsIsHelpError", None)  # click >= 8.2
    return no_args is not None and isinstance(error, no_args)


def _exit_with_usage_code(error: click.UsageError) -> None:
    """Make click's ``main`` exit with 64 (EX_USAGE) for ``error`` rather than its own 2: the
    code is read from the instance (click declares a class default; ``show`` is unchanged,
    so a group called without a command still prints its help)."""
    setattr(error, "exit_code", Exit.USAGE)  # noqa: B010 (click types it as a ClassVar)


@click.group(
    cls=_Group,
    context_settings={"auto_envvar_prefix": "ALLOCATOR", "show_default": True},
    epilog=exit_table(),
)
@click.version_option(
    __version__, package_name=DISTRIBUTION, prog_name="allocator", message=VERSION_MESSAGE
)
@click.pass_context
def main(ctx: click.Context) -> None:
    """Leader-elected allocator of Snowflake ID blocks."""
    # An argument that was not UTF-8 (a path) reaches us surrogate-escaped: print it back as
    # the bytes it came from instead of failing on it.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="surrogateescape")
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logs.handler())
        root.setLevel(logging.WARNING)
    if ctx.invoked_subcommand != "run":
        _quiet_kazoo(ctx)


def _quiet_kazoo(ctx: click.Context) -> None:
    """kazoo below ERROR silenced until the command ends, in every command but ``run`` (a
    node logs its reconnects).

    Its retry chatter, a WARNING per refused connection, never comes before a command's one
    error line, which says the same.
    """
    kazoo = logging.getLogger("kazoo")
    level = kazoo.level
    kazoo.setLevel(logging.ERROR)
    ctx.call_on_close(lambda: kazoo.setLevel(level))


def _register() -> None:
    """Add every command of :data:`allocator.commands.COMMANDS` to the group."""
    from allocator.commands import COMMANDS

    for command in COMMANDS:
        main.add_command(command)


_register()

if __name__ == "__main__":
    main()

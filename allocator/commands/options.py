"""Options the CLI's commands share, declared once (names and types the same everywhere), and
the two kinds it treats apart: dangerous choices (:func:`typed_option`) and options that
could carry a secret (:func:`database_url_option`, :func:`no_secret_pairs`). Every command's
``--help`` ends with its exit codes (:func:`exit_codes`); docs/design.md §7.
"""

from __future__ import annotations

import functools
import sys
import textwrap
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from allocator import config as config_mod
from allocator.core import durations, exits, redact
from allocator.core.errors import InvalidDurationError, UsageError
from allocator.core.exits import Exit
from allocator.local.cluster import MAX_ZK_SERVERS
from allocator.local.record import DEFAULT_ZK_SERVERS

F = TypeVar("F", bound=Callable[..., Any])

DANGEROUS_NAMES = frozenset({"yes", "target", "purge", "after_restore", "reason", "node_command"})
"""Parameter names of the options no environment variable may set: a dangerous choice (a
confirmation, a destructive target, an audit record's reason, what runs as a node). A unit
test walks every command and fails on an option of one of these names (or a
confirmation-like one) that the environment could set."""

NEVER_FROM_ENV = "Never read from the environment."
ZK_SERVERS_HELP = (
    f"ZooKeeper servers of the embedded cluster: an odd number from 1 to {MAX_ZK_SERVERS}. "
    f"[default: {DEFAULT_ZK_SERVERS} for a new cluster, else as recorded]"
)
SECRET_ENV_NAMES = frozenset(
    config_mod.env_name(key) for key in config_mod.SECRET_KEYS if key != "postgres.url"
)
"""Variables whose every value is a secret (a URL is one only when it holds a password)."""


ExitCode = tuple[Exit, str]
"""An exit code (a row of the one table) and what it means for one command."""
EXIT_CODES_HEADING = "Exit codes:"
OK: ExitCode = (Exit.OK, "done")
OTHER: ExitCode = (Exit.FAILED, "any other error (one line on stderr)")
INTERRUPTED: ExitCode = (Exit.FAILED, "interrupted (Ctrl-C)")
USAGE: ExitCode = (Exit.USAGE, "bad arguments or options")
CONFIG: ExitCode = (
    Exit.CONFIG,
    "invalid configuration (every problem named), a login refused (the PostgreSQL role or "
    "the ZooKeeper identity named)",
)
UNREACHABLE: ExitCode = (
    Exit.TEMPFAIL,
    "ZooKeeper or PostgreSQL unreachable or too slow: retry later",
)
PREREQUISITE: ExitCode = (
    Exit.UNAVAILABLE,
    "a package the embedded cluster needs is missing (zookeeper, postgresql, java)",
)
SERVER_START: ExitCode = (
    Exit.SOFTWARE,
    "a server of the embedded cluster did not start (its log's tail follows)",
)
PORT_IN_USE: ExitCode = (
    Exit.TEMPFAIL,
    "a port the embedded cluster needs is taken by another process",
)
NO_LOCAL_CLUSTER: ExitCode = (
    Exit.FAILED,
    "no cluster recorded in the state folder (or not a valid record)",
)
EMBEDDED_CLUSTER: tuple[ExitCode, ...] = (PREREQUISITE, SERVER_START, PORT_IN_USE)
"""What starting an embedded cluster (``local up``, ``demo``, a drill's or bench's own) can
end in."""
GROUP_CODES: tuple[ExitCode, ...] = (
    (Exit.OK, "those of the subcommand"),
    (Exit.USAGE, "no such subcommand, or bad options"),
)
HELP_WIDTH = 78


def exit_codes(*codes: tuple[int, str]) -> str:
    """A command's ``epilog``: ``Exit codes:`` and one line per code, in numeric order;
    two meanings of one code are joined with ``;``. ``\\b`` keeps click from rewrapping.
    A code that is no row of the one table (:class:`allocator.core.exits.Exit`) is a
    ValueError (the command is not built). A unit test checks every command lists them."""
    meanings: dict[Exit, list[str]] = {}
    for code, meaning in codes:
        meanings.setdefault(Exit(code), []).append(meaning)
    lines = [f"  {int(code):<3} {'; '.join(meanings[code])}" for code in sorted(meanings)]
    return "\n".join(["\b", EXIT_CODES_HEADING, *lines])


def exit_table() -> str:
    """``allocator --help``'s epilog: the whole table (:mod:`allocator.core.exits`), each
    meaning wrapped under its code."""
    lines = ["\b", EXIT_CODES_HEADING]
    for line in exits.help_lines():
        code, _space, meaning = line.partition(" ")
        wrapped = textwrap.wrap(meaning.strip(), HELP_WIDTH - 8)
        lines.append(f"  {code:<3} {wrapped[0]}")
        lines += [f"      {more}" for more in wrapped[1:]]
    lines.append("Every command's --help says what each means for it; docs/exit-codes.md.")
    return "\n".join(lines)


def typed_option(*param_decls: str, **attrs: Any) -> Callable[[F], F]:
    """``click.option`` for a dangerous choice: never taken from an ``ALLOCATOR_*`` variable.

    A person types it each time: ``allow_from_autoenv=False`` and no ``envvar``, whatever
    ``auto_envvar_prefix`` the group has (:data:`DANGEROUS_NAMES`)."""
    if attrs.get("envvar") or attrs.get("show_envvar"):
        raise TypeError("a typed option has no environment variable")
    attrs["help"] = f"{attrs.get('help', '')} {NEVER_FROM_ENV}".strip()
    return click.option(*param_decls, allow_from_autoenv=False, envvar=None, **attrs)


def _from_command_line(ctx: click.Context, param: click.Parameter) -> bool:
    return param.name is not None and (
        ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE
    )


def _env_var(ctx: click.Context, param: click.Parameter) -> str:
    if ctx.auto_envvar_prefix and param.name:
        return f"{ctx.auto_envvar_prefix}_{param.name.upper()}"
    return "the environment"


def _check_database_url(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> str | None:
    if value and _from_command_line(ctx, param) and redact.carries_secret(value):
        raise UsageError(
            "--database-url must not carry a password on the command line (every process "
            f"list shows it): set {_env_var(ctx, param)}, or put the URL in a file and pass "
            "--database-url-file PATH, or leave the password out of the URL and give it "
            "through PGPASSWORD or a PGPASSFILE"
        )
    return value


def read_url_file(path: Path) -> str:
    """The URL in ``path``: its first line, stripped (``--database-url-file``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise UsageError(f"--database-url-file {path}: cannot read it ({reason})") from None
    lines = text.strip().splitlines()
    if not lines or not lines[0].strip():
        raise UsageError(f"--database-url-file {path}: the file is empty")
    return lines[0].strip()


def database_url_option(help: str) -> Callable[[F], F]:
    """``--database-url`` (``help`` says whose URL) and ``--database-url-file``, handed to
    the command as one ``database_url`` parameter (None when neither is given).

    No flag carries a secret, because a command line shows in every process list: a URL with
    a password (or any libpq secret parameter) is refused on the command line, with one line
    naming the alternatives (the command's ``ALLOCATOR_<COMMAND>_DATABASE_URL``, the file,
    or ``PGPASSWORD`` / ``PGPASSFILE``). The same URL from the environment is fine."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            url, path = kwargs.pop("database_url"), kwargs.pop("database_url_file")
            if url and path:
                raise UsageError("give --database-url or --database-url-file, not both")
            kwargs["database_url"] = read_url_file(path) if path else url
            return func(*args, **kwargs)

        click.option(
            "--database-url-file",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            show_envvar=True,
            help="A file whose first line is the PostgreSQL URL (for a URL with a password).",
        )(command)
        click.option(
            "--database-url",
            default=None,
            show_envvar=True,
            callback=_check_database_url,
            help=f"{help} A URL with a password is refused here: use the variable, "
            "--database-url-file, or PGPASSWORD / PGPASSFILE.",
        )(command)
        return command  # type: ignore[return-value]

    return decorate


def no_secret_pairs(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    """Callback of a repeatable ``NAME=VALUE`` option: refuses, on the command line, a
    secret variable (``ALLOCATOR_ZOOKEEPER_AUTH``, ``ALLOCATOR_NODE_ADMIN_TOKEN``) or a value
    that carries a password."""
    if not _from_command_line(ctx, param):
        return value
    for pair in value:
        name, _equals, text = pair.partition("=")
        if (name.strip() in SECRET_ENV_NAMES and text) or redact.carries_secret(text):
            flag = param.opts[0] if param.opts else "this option"
            raise UsageError(
                f"{flag} {name.strip()}=...: a secret is never taken from the command line "
                f"(every process list shows it); set {_env_var(ctx, param)} instead"
            )
    return value


def state_dir_option(
    default: Path,
    help: str = "State folder of the embedded cluster (and of the JSON).",
    envvar: str | None = None,
) -> Callable[[F], F]:
    """``--state-dir``: a folder (not a file), ``default`` when not given."""
    return click.option(
        "--state-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=default,
        envvar=envvar,
        show_envvar=True,
        help=help,
    )


def json_out_option(stem: str) -> Callable[[F], F]:
    """``--json-out``: where the JSON goes, by default ``<state-dir>/<stem>-<time>.json``."""
    return click.option(
        "--json-out",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        show_envvar=True,
        help=f"Where to write the JSON. [default: <state-dir>/{stem}-<time>.json]",
    )


def json_option(help: str = "Print the JSON instead of the table.") -> Callable[[F], F]:
    """``--json``, a flag handed to the command as ``as_json``."""
    return click.option("--json", "as_json", is_flag=True, show_envvar=True, help=help)


def keep_option(help: str = "Leave the embedded cluster running.") -> Callable[[F], F]:
    """``--keep``: leave the embedded cluster running at the end."""
    return click.option("--keep", is_flag=True, show_envvar=True, help=help)


def bench_output_options(stem: str) -> Callable[[F], F]:
    """``--json-out`` (default ``<state-dir>/<stem>-<time>.json``), ``--json`` and
    ``--keep``, in that order: what every bench command ends its options with."""

    def decorate(func: F) -> F:
        return json_out_option(stem)(json_option()(keep_option()(func)))

    return decorate


def _odd_servers(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None and value % 2 == 0:
        *smaller, largest = [str(n) for n in range(1, MAX_ZK_SERVERS + 1, 2)]
        raise click.BadParameter(
            f"{value} is even: an ensemble has an odd number of servers "
            f"({', '.join(smaller)} or {largest}), since a majority of them must agree",
            ctx=ctx,
            param=param,
        )
    return value


def zk_servers_option(func: F) -> F:
    """``--zk``: how many ZooKeeper servers an embedded cluster runs, handed over as
    ``zk_servers``: an odd number up to ``MAX_ZK_SERVERS``, or None when not given (3 for a
    new cluster, else as recorded). Every command that starts one takes this one option."""
    option = click.option(
        "--zk",
        "zk_servers",
        type=click.IntRange(1, MAX_ZK_SERVERS),
        default=None,
        callback=_odd_servers,
        show_envvar=True,
        help=ZK_SERVERS_HELP,
    )
    return option(func)


def nodes_option(minimum: int, maximum: int, default: int | None, help: str) -> Callable[[F], F]:
    """``--nodes``: how many allocator nodes the embedded cluster runs."""
    return click.option(
        "--nodes",
        type=click.IntRange(minimum, maximum),
        default=default,
        show_envvar=True,
        help=help,
    )


def session_timeout_option(default_ms: int | None, help: str) -> Callable[[F], F]:
    """``--session-timeout`` (hidden old spelling ``--session-timeout-ms``): the nodes'
    ZooKeeper session timeout, handed over in milliseconds as ``session_timeout_ms``."""
    return duration_option(
        "--session-timeout",
        kind=Duration(step=MILLISECOND),
        default=None if default_ms is None else timedelta(milliseconds=default_ms),
        help=help,
        into="session_timeout_ms",
        convert=durations.milliseconds,
        old_flag="--session-timeout-ms",
        old_unit="ms",
    )


MILLISECOND = timedelta(milliseconds=1)
SECOND = timedelta(seconds=1)
_STEP_NAMES = {MILLISECOND: "milliseconds", SECOND: "seconds"}


if TYPE_CHECKING:  # click's types are generic in its stubs only from 8.4 on
    _DurationBase = click.ParamType[timedelta, Any]
else:
    _DurationBase = click.ParamType


class Duration(_DurationBase):
    """A duration flag's type: every duration flag takes a number with a unit (``30s``,
    ``500ms``, ``2h``, ``1m30s``), its variable the same text, as :func:`durations.parse`
    reads it; the command gets a ``timedelta`` within ``minimum`` .. ``maximum`` (zero only
    with ``zero``), a whole number of ``step`` when given. With ``bare_unit`` a number
    without a unit is read in that unit (what the flag took before, as ``watch --duration``
    and ``--timeout``), with a warning unless ``warn_bare`` is off."""

    name = "duration"

    def __init__(
        self,
        *,
        minimum: timedelta = timedelta(0),
        maximum: timedelta = durations.MAX,
        zero: bool = False,
        step: timedelta | None = None,
        bare_unit: str | None = None,
        warn_bare: bool = True,
    ) -> None:
        if bare_unit is not None and bare_unit not in durations.UNITS:
            raise ValueError(f"not a unit: {bare_unit!r}")
        self.minimum, self.maximum, self.zero, self.step = minimum, maximum, zero, step
        self.bare_unit, self.warn_bare = bare_unit, warn_bare

    def reading_bare(self, unit: str) -> Duration:
        """The same bounds, a bare number read in ``unit`` without a warning (an old
        spelling's type: the caller warns about the spelling itself)."""
        return Duration(
            minimum=self.minimum,
            maximum=self.maximum,
            zero=self.zero,
            step=self.step,
            bare_unit=unit,
            warn_bare=False,
        )

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> timedelta:
        if isinstance(value, timedelta):
            return value
        text = str(value)
        if self.bare_unit is not None and durations.is_bare_number(text):
            number = text.strip()
            text = f"{number}{self.bare_unit}"
            if self.warn_bare:
                warn(
                    f"{given_as(ctx, param)} {number}: a number without a unit is deprecated; "
                    f"write {text}"
                )
        try:
            found = durations.parse(text)
        except InvalidDurationError as exc:
            self.fail(str(exc), param, ctx)
        shown = repr(text.strip())
        if not found and not self.zero:
            self.fail(f"{shown}: must be more than 0", param, ctx)
        if found < self.minimum:
            self.fail(f"{shown} is less than {durations.format_duration(self.minimum)}", param, ctx)
        if found > self.maximum:
            self.fail(f"{shown} is more than {durations.format_duration(self.maximum)}", param, ctx)
        if self.step and found % self.step:
            steps = _STEP_NAMES.get(self.step, f"steps of {durations.format_duration(self.step)}")
            self.fail(f"{shown} is not a whole number of {steps}", param, ctx)
        return found


def warn(text: str) -> None:
    """One ``warning:`` line on stderr (a deprecated spelling, ...)."""
    click.echo(f"warning: {text}", err=True)


def given_as(ctx: click.Context | None, param: click.Parameter | None) -> str:
    """How a value reached ``param``: its flag, or the environment variable that set it."""
    if param is None:
        return "the value"
    source = ctx.get_parameter_source(param.name) if ctx and param.name else None
    if source is ParameterSource.ENVIRONMENT and ctx is not None:
        named = param.envvar if isinstance(param.envvar, str) else None
        return named or _env_var(ctx, param)
    return param.opts[0] if param.opts else str(param.name)


def duration_option(
    flag: str,
    *,
    kind: Duration,
    default: timedelta | None,
    help: str,
    into: str | None = None,
    convert: Callable[[timedelta], Any] | None = None,
    old_flag: str | None = None,
    old_unit: str = "s",
    old_envvar: str | None = None,
) -> Callable[[F], F]:
    """A duration flag ``flag`` of type ``kind`` (its variable: the auto ``ALLOCATOR_*``
    name), handed to the command as ``into`` (default: the flag's own name), passed
    through ``convert`` when given (e.g. :func:`durations.milliseconds`).

    ``old_flag``: the spelling it replaces, kept as a hidden alias whose bare number is
    read in ``old_unit`` (its own variable works too); ``old_envvar``: a variable name the
    flag had before. Either warns when used; the old and the new spelling together are a
    usage error."""
    name = click.Option([flag]).name
    old_name = click.Option([old_flag]).name if old_flag else None
    target = into or name
    if name is None or target is None:
        raise TypeError(f"no parameter name for {flag}")

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            ctx = click.get_current_context()
            value = kwargs.pop(name)
            given = _given(ctx, name)
            if old_name is not None:
                old = kwargs.pop(old_name)
                if old is not None and given:
                    raise UsageError(f"give {flag} or {old_flag}, not both")
                if old is not None:
                    old_param = next(p for p in ctx.command.params if p.name == old_name)
                    warn(
                        f"{given_as(ctx, old_param)} is deprecated: use {flag} "
                        f"{durations.format_duration(old)}"
                    )
                    value, given = old, True
            old_text = config_mod.process_environment().get(old_envvar) if old_envvar else None
            if old_envvar is not None and old_text is not None and not given:
                try:
                    value = kind.reading_bare(old_unit).convert(old_text, None, ctx)
                except click.BadParameter as exc:
                    raise UsageError(f"{old_envvar}: {exc.message}") from None
                new_param = next(p for p in ctx.command.params if p.name == name)
                warn(
                    f"{old_envvar} is deprecated: set {_env_var(ctx, new_param)}="
                    f"{durations.format_duration(value)}"
                )
            try:
                kwargs[target] = value if value is None or convert is None else convert(value)
            except ValueError as exc:  # e.g. a fraction of the unit the command takes
                raise UsageError(f"{flag}: {exc}") from None
            return func(*args, **kwargs)

        if old_flag is not None:
            click.option(
                old_flag,
                type=kind.reading_bare(old_unit),
                default=None,
                hidden=True,
                help=f"Deprecated: {flag} (a number here is in {old_unit}).",
            )(command)
        click.option(
            flag,
            type=kind,
            default=None if default is None else durations.format_duration(default),
            show_envvar=True,
            help=help,
        )(command)
        return command  # type: ignore[return-value]

    return decorate


def _given(ctx: click.Context, name: str) -> bool:
    """True when the parameter ``name`` came from the command line or its variable."""
    return ctx.get_parameter_source(name) in (
        ParameterSource.COMMANDLINE,
        ParameterSource.ENVIRONMENT,
    )


def config_option(func: F) -> F:
    """``--config PATH`` (also ``ALLOCATOR_CONFIG``) as the ``config_path`` parameter."""
    option = click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar=config_mod.CONFIG_PATH_ENV,
        show_envvar=True,
        help="TOML config file (optional); ALLOCATOR_* variables and flags win over it.",
    )
    return option(func)


def set_option(func: F) -> F:
    """Repeatable ``--set SECTION.KEY=VALUE`` as the ``set_pairs`` parameter."""
    option = click.option(
        "--set",
        "set_pairs",
        multiple=True,
        metavar="SECTION.KEY=VALUE",
        help="Override one config key; wins over the file and ALLOCATOR_* variables. Repeatable.",
    )
    return option(func)


def config_options(func: F) -> F:
    """Both :func:`config_option` and :func:`set_option`."""
    return config_option(set_option(func))


def check_confirmable(yes: bool, what: str) -> None:
    """Refuses at once when nobody could answer the question (``what``: the change)."""
    if not yes and not sys.stdin.isatty():
        raise UsageError(f"{what}; pass --yes to confirm (stdin is not a terminal)")


def audited_options(
    record: str, *, confirm: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--reason``, ``--yes`` (without ``confirm``: none, as for ``pool pause``, which takes
    nothing away that ``resume`` does not give back), ``--json``, ``--database-url`` and the
    config options of an audited operator command whose why lands in ``record``; neither
    ``--reason`` nor ``--yes`` comes from the environment."""
    chosen = [
        typed_option(
            "--reason",
            required=True,
            help=f"Why (1..1000 characters); recorded with who and when in {record}.",
        ),
        *(
            [
                typed_option(
                    "--yes",
                    is_flag=True,
                    help="Confirm without a prompt (needed when stdin is not a terminal).",
                )
            ]
            if confirm
            else []
        ),
        click.option(
            "--json", "as_json", is_flag=True, show_envvar=True, help="Print one JSON object."
        ),
        database_url_option(
            help="PostgreSQL URL of a login role granted allocator_operator. "
            "[default: config postgres.url]"
        ),
        config_options,
    ]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(chosen):
            command = option(command)
        return command

    return decorate

"""Two kinds of option the CLI treats apart: dangerous choices, and options that could carry
a secret.

Rules:

- A dangerous choice (a confirmation, a destructive target, an audit record's reason, what
  runs as a node) is typed by a person each time: :func:`typed_option` makes an option that
  no ``ALLOCATOR_*`` variable can set (click's ``allow_from_autoenv=False``, no
  ``envvar``), whatever ``auto_envvar_prefix`` the group has. :data:`DANGEROUS_NAMES` lists
  what such an option is called; a unit test walks every command and fails on an option
  of one of these names (or a confirmation-like one) that the environment could set.
- No flag carries a secret, because a command line shows in every process list.
  :func:`database_url_option` gives a command ``--database-url`` and
  ``--database-url-file``: a URL that holds a password (or any libpq secret parameter) is
  refused on the command line, with one line saying where to put it instead: the
  command's own ``ALLOCATOR_<COMMAND>_DATABASE_URL``, a file named by
  ``--database-url-file`` (its first line is the URL), or libpq's ``PGPASSWORD`` /
  ``PGPASSFILE`` with a password-free URL. The same URL from the environment is fine.
  :func:`no_secret_pairs` does the same for ``NAME=VALUE`` options that set variables
  (``local up --node-env``).
- Options several commands share are declared once, here: ``--state-dir``
  (:func:`state_dir_option`), ``--json-out`` / ``--json`` / ``--keep``
  (:func:`json_out_option`, :func:`json_option`, :func:`keep_option`, together
  :func:`bench_output_options`), and the embedded cluster's shape: ``--zk``,
  ``--nodes``, ``--session-timeout-ms`` (:func:`zk_servers_option`, :func:`nodes_option`,
  :func:`session_timeout_option`); and the configuration's ``--config`` and ``--set``
  (:func:`config_options`, read with :func:`allocator.config.load_from_options`). A
  command passes what differs (its default folder, its JSON file's stem, its defaults,
  its help); names and types stay the same everywhere. ``--zk`` takes nothing from the
  command: the same values, default and help in ``local up``, ``demo`` and ``drill``.
- Every command's ``--help`` ends with its exit codes: :func:`exit_codes` makes the epilog
  from entries whose numbers come from :mod:`allocator.core.errors` (:data:`OK`, :data:`USAGE`,
  :data:`CONFIG`, ...), so a listed code is the one the error really carries; each entry
  says what it means for that command. A unit test checks every command lists them.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from allocator import config as config_mod
from allocator.core import errors, redact
from allocator.core.errors import UsageError
from allocator.local.cluster import MAX_ZK_SERVERS
from allocator.local.record import DEFAULT_ZK_SERVERS

F = TypeVar("F", bound=Callable[..., Any])

DANGEROUS_NAMES = frozenset({"yes", "target", "purge", "after_restore", "reason", "node_command"})
"""Parameter names of the options no environment variable may set (see the module rules)."""

NEVER_FROM_ENV = "Never read from the environment."
ZK_SERVERS_HELP = (
    f"ZooKeeper servers of the embedded cluster: an odd number from 1 to {MAX_ZK_SERVERS}. "
    f"[default: {DEFAULT_ZK_SERVERS} for a new cluster, else as recorded]"
)
SECRET_ENV_NAMES = frozenset(
    config_mod.env_name(key) for key in config_mod.SECRET_KEYS if key != "postgres.url"
)
"""Variables whose every value is a secret (a URL is one only when it holds a password)."""


ExitCode = tuple[int, str]
"""An exit code and what it means for one command."""
EXIT_CODES_HEADING = "Exit codes:"
OK: ExitCode = (0, "done")
OTHER: ExitCode = (errors.AllocatorError.exit_code, "any other error (one line on stderr)")
INTERRUPTED: ExitCode = (1, "interrupted (Ctrl-C)")
USAGE: ExitCode = (errors.UsageError.exit_code, "bad arguments or options")
CONFIG: ExitCode = (
    errors.ConfigError.exit_code,
    "invalid configuration (every problem named), or ZooKeeper refused zookeeper.auth",
)
UNAVAILABLE: ExitCode = (
    errors.ZooKeeperUnavailableError.exit_code,
    "ZooKeeper or PostgreSQL unreachable or too slow: retry later",
)
PREREQUISITE: ExitCode = (
    errors.PrerequisiteError.exit_code,
    "a package the embedded cluster needs is missing (zookeeper, postgresql, java)",
)
SERVER_START: ExitCode = (
    errors.ServerStartError.exit_code,
    "a server of the embedded cluster did not start (its log's tail follows)",
)
PORT_IN_USE: ExitCode = (
    errors.PortInUseError.exit_code,
    "a port the embedded cluster needs is taken by another process",
)
NO_LOCAL_CLUSTER: ExitCode = (
    errors.LocalClusterError.exit_code,
    "no cluster recorded in the state folder (or not a valid record)",
)
EMBEDDED_CLUSTER: tuple[ExitCode, ...] = (PREREQUISITE, SERVER_START, PORT_IN_USE)
"""What starting an embedded cluster (``local up``, ``demo``, a drill's or bench's own) can
end in."""
GROUP_CODES: tuple[ExitCode, ...] = (
    (0, "those of the subcommand"),
    (errors.UsageError.exit_code, "no such subcommand, or bad options"),
)


def exit_codes(*codes: ExitCode) -> str:
    """A command's ``epilog``: ``Exit codes:`` and one line per code, in numeric order;
    two meanings of one code are joined with ``;``. ``\\b`` keeps click from rewrapping."""
    meanings: dict[int, list[str]] = {}
    for code, meaning in codes:
        meanings.setdefault(code, []).append(meaning)
    lines = [f"  {code:<3} {'; '.join(meanings[code])}" for code in sorted(meanings)]
    return "\n".join(["\b", EXIT_CODES_HEADING, *lines])


def typed_option(*param_decls: str, **attrs: Any) -> Callable[[F], F]:
    """``click.option`` for a dangerous choice: never taken from an ``ALLOCATOR_*`` variable."""
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
    the command as one ``database_url`` parameter (None when neither is given)."""

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


def session_timeout_option(default: int | None, help: str) -> Callable[[F], F]:
    """``--session-timeout-ms``: the nodes' ZooKeeper session timeout."""
    return click.option(
        "--session-timeout-ms",
        type=click.IntRange(min=1),
        default=default,
        show_envvar=True,
        help=help,
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

"""The PostgreSQL server of the embedded cluster, run from the installed PostgreSQL binaries.

Rules:

- Layout: ``<state>/pg/`` holds ``data/`` (``initdb``), ``postgres.log`` (the postmaster's
  stdout and stderr; no logging collector), ``postgres.pid`` and ``initdb.log``.
- OS user: PostgreSQL refuses to run as root. When we are root, ``initdb`` and ``postgres``
  run as the OS user ``postgres``: ``<state>/pg`` is chown-ed to it, and the child process
  drops to its uid, gid and groups before ``exec`` (see :mod:`allocator.local.processes`),
  with ``/`` as working directory. Otherwise they run as ourselves. The database superuser
  has the same name as that OS user.
- Authentication is ``trust``: acceptable only because the server listens on 127.0.0.1 and
  has no Unix socket; any local user can connect as superuser. A dev/test server, no more.
- Whatever state folder a user gives must work. If the ``postgres`` user cannot reach
  ``<state>/pg`` (a parent folder is private, e.g. pytest's 0700 temp folders), the data
  folder is created with ``mkdtemp`` in the system temp folder, owned by ``postgres`` with
  mode 0700, and ``<state>/pg/data`` is a symlink to it. We never loosen the permissions of
  the user's folders. ``allocator local down --purge`` removes the relocated folder too.
- Settings live in ``data/allocator.conf``, rewritten at every start and included from
  ``postgresql.conf``: ``listen_addresses='127.0.0.1'``, the recorded port,
  ``unix_socket_directories=''``, ``fsync``/``synchronous_commit``/``full_page_writes`` on
  (durability tests depend on them), small memory, ``max_connections=200``.
- The postmaster is a daemon started directly (``postgres -D``), so we hold its pid. Stop
  modes are the signals ``pg_ctl`` sends: smart = SIGTERM, fast = SIGINT, immediate =
  SIGQUIT (no shutdown checkpoint; the next start runs crash recovery).
- Ready = a psycopg connection succeeds. The ``allocator`` database is created if missing.
- Missing binaries raise :class:`PrerequisiteError` naming the apt-get fix; a failed
  ``initdb`` or start raises :class:`ServerStartError` with the log tail.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import psycopg
from psycopg import sql

from allocator.errors import LocalClusterError, PrerequisiteError, ServerStartError
from allocator.local import processes
from allocator.local.ports import LOOPBACK

log = logging.getLogger(__name__)

SERVER_OS_USER = "postgres"
BIN_DIR_ENV = "ALLOCATOR_PG_BIN_DIR"
DATABASE = "allocator"
INSTALL_HINT = "apt-get install postgresql-15"
SETTINGS_FILE = "allocator.conf"
READY_POLL_INTERVAL_S = 0.05
CONNECT_TIMEOUT_S = 2  # libpq's minimum

StopMode = Literal["smart", "fast", "immediate"]
STOP_MODES: tuple[StopMode, ...] = ("smart", "fast", "immediate")
_STOP_SIGNALS: dict[StopMode, signal.Signals] = {
    "smart": signal.SIGTERM,
    "fast": signal.SIGINT,
    "immediate": signal.SIGQUIT,
}
_STOP_TIMEOUTS_S: dict[StopMode, float] = {"smart": 60.0, "fast": 30.0, "immediate": 10.0}
_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


def find_bin_dir(override: Path | None = None) -> Path:
    """The folder with ``initdb`` and ``postgres``, or raise :class:`PrerequisiteError`.

    Order: ``override``, ``$ALLOCATOR_PG_BIN_DIR``, the newest ``/usr/lib/postgresql/*/bin``,
    then wherever ``initdb`` is on PATH.
    """
    candidates: list[Path] = []
    if override is not None:
        candidates.append(override)
    elif env := os.environ.get(BIN_DIR_ENV):
        candidates.append(Path(env))
    else:
        versions = sorted(
            Path("/usr/lib/postgresql").glob("*/bin"),
            key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)] or [0],
            reverse=True,
        )
        candidates.extend(versions)
        if on_path := shutil.which("initdb"):
            candidates.append(Path(on_path).resolve().parent)
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "postgres").is_file():
            return folder
    where = ", ".join(str(c) for c in candidates) or "/usr/lib/postgresql/*/bin and PATH"
    raise PrerequisiteError(
        f"PostgreSQL is not installed (no initdb and postgres in {where}): {INSTALL_HINT}"
    )


def server_user() -> processes.OsUser:
    """The OS user the server runs as: ``postgres`` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return processes.OsUser.current()
    try:
        return processes.OsUser.lookup(SERVER_OS_USER)
    except KeyError:
        raise PrerequisiteError(
            f"PostgreSQL refuses to run as root and there is no OS user {SERVER_OS_USER!r} "
            f"to run it as: {INSTALL_HINT} (creates it), or useradd --system {SERVER_OS_USER}"
        ) from None


def pg_dir(state_dir: Path) -> Path:
    """``<state>/pg``."""
    return state_dir / "pg"


def log_path(state_dir: Path) -> Path:
    """The postmaster's log file."""
    return pg_dir(state_dir) / "postgres.log"


def pid_path(state_dir: Path) -> Path:
    """The postmaster's pid file (ours; PostgreSQL keeps its own ``postmaster.pid``)."""
    return pg_dir(state_dir) / "postgres.pid"


def database_url(superuser: str, port: int, database: str = DATABASE) -> str:
    """``postgresql://<superuser>@127.0.0.1:<port>/<database>``."""
    return f"postgresql://{quote(superuser, safe='')}@{LOOPBACK}:{port}/{quote(database)}"


def prepare_data_dir(state_dir: Path, user: processes.OsUser) -> Path:
    """Create ``<state>/pg`` for ``user``; return the data folder the server will use.

    That is ``<state>/pg/data`` when ``user`` can reach it, else a relocated folder that
    ``<state>/pg/data`` links to (see the module rules).
    """
    base = pg_dir(state_dir)
    base.mkdir(parents=True, exist_ok=True)
    _own(base, user)
    link = base / "data"
    if link.is_symlink():
        target = Path(os.readlink(link))
        if target.is_dir():
            return target
        log.warning("postgres_data_missing link=%s target=%s: initialising anew", link, target)
        link.unlink()
    elif link.exists() or _reachable(base, user):
        return link
    target = Path(tempfile.mkdtemp(prefix="allocator-pg-"))
    _own(target, user)
    link.symlink_to(target, target_is_directory=True)
    log.warning(
        "postgres_data_relocated state=%s data=%s: OS user %s cannot reach %s",
        state_dir,
        target,
        user.name,
        base,
    )
    return target


def relocated_data_dir(state_dir: Path) -> Path | None:
    """The folder ``<state>/pg/data`` links to, if it was relocated."""
    link = pg_dir(state_dir) / "data"
    return Path(os.readlink(link)) if link.is_symlink() else None


def is_initialized(data_dir: Path) -> bool:
    """True if ``initdb`` has completed in ``data_dir``."""
    return (data_dir / "PG_VERSION").is_file()


def initdb(
    bin_dir: Path, state_dir: Path, data_dir: Path, user: processes.OsUser, superuser: str
) -> None:
    """Run ``initdb`` (UTF8, no locale, trust auth) as ``user``."""
    out = pg_dir(state_dir) / "initdb.log"
    offset = out.stat().st_size if out.exists() else 0
    argv = [
        str(bin_dir / "initdb"),
        "-D",
        str(data_dir),
        "-U",
        superuser,
        "--auth=trust",
        "--encoding=UTF8",
        "--no-locale",
        "--no-instructions",
    ]
    code = processes.run(argv, log_path=out, env=_ENV, cwd=Path("/"), user=user)
    if code != 0:
        raise ServerStartError(
            f"initdb failed (exit {code}); last lines of {out}:\n"
            + processes.tail(out, offset=offset)
        )


def render_settings(port: int) -> str:
    """The text of ``allocator.conf``."""
    settings = {
        "listen_addresses": "'127.0.0.1'",
        "port": str(port),
        "unix_socket_directories": "''",
        "max_connections": "200",
        "superuser_reserved_connections": "3",
        "shared_buffers": "'32MB'",
        "work_mem": "'2MB'",
        "maintenance_work_mem": "'32MB'",
        "effective_cache_size": "'256MB'",
        "min_wal_size": "'32MB'",
        "max_wal_size": "'256MB'",
        "fsync": "on",
        "synchronous_commit": "on",
        "full_page_writes": "on",
        "huge_pages": "off",
        "logging_collector": "off",
        "log_destination": "'stderr'",
        "log_line_prefix": "'%m [%p] %q%u@%d '",
        "log_timezone": "'UTC'",
        "timezone": "'UTC'",
    }
    head = "# Generated by `allocator local`; rewritten at every start. Loopback-only server.\n"
    return head + "".join(f"{key} = {value}\n" for key, value in settings.items())


def write_settings(data_dir: Path, port: int, user: processes.OsUser) -> None:
    """Write ``allocator.conf`` and include it from ``postgresql.conf`` (once)."""
    settings = data_dir / SETTINGS_FILE
    settings.write_text(render_settings(port))
    settings.chmod(0o600)
    _own(settings, user)
    main = data_dir / "postgresql.conf"
    include = f"include_if_exists = '{SETTINGS_FILE}'"
    text = main.read_text()
    if include not in text:
        main.write_text(text + f"\n# Added by `allocator local`\n{include}\n")


def command(bin_dir: Path, data_dir: Path) -> list[str]:
    """The postmaster command line."""
    return [str(bin_dir / "postgres"), "-D", str(data_dir)]


def start(
    bin_dir: Path, state_dir: Path, data_dir: Path, port: int, user: processes.OsUser
) -> processes.Daemon:
    """Write the settings and start the postmaster as a daemon (not waiting for it)."""
    write_settings(data_dir, port, user)
    daemon = processes.start(
        command(bin_dir, data_dir),
        log_path=log_path(state_dir),
        pid_path=pid_path(state_dir),
        env=_ENV,
        cwd=Path("/"),
        user=user,
    )
    _own(log_path(state_dir), user)
    return daemon


def wait_ready(daemon: processes.Daemon, port: int, superuser: str, deadline: float) -> None:
    """Wait until a connection succeeds; :class:`ServerStartError` with the log tail if not."""
    url = database_url(superuser, port, "postgres")
    while True:
        if not processes.is_alive(daemon.pid, daemon.argv):
            raise ServerStartError(
                f"PostgreSQL (pid {daemon.pid}) exited during start; last lines of "
                f"{daemon.log_path}:\n" + processes.tail(daemon.log_path, offset=daemon.log_offset)
            )
        try:
            with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S):
                return
        except psycopg.OperationalError as exc:
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"PostgreSQL (pid {daemon.pid}, port {port}) did not accept connections by "
                    f"its deadline; last lines of {daemon.log_path}:\n"
                    + processes.tail(daemon.log_path, offset=daemon.log_offset)
                ) from exc
        time.sleep(READY_POLL_INTERVAL_S)


def ensure_database(port: int, superuser: str, database: str = DATABASE) -> None:
    """Create ``database`` if it does not exist."""
    url = database_url(superuser, port, "postgres")
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (database,)
            ).fetchone()
            if found is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    except psycopg.Error as exc:
        raise LocalClusterError(f"could not create database {database!r} on port {port}") from exc


def stop(pid: int | None, argv: list[str], state_dir: Path, mode: StopMode = "fast") -> bool:
    """Stop the postmaster with ``mode``'s signal (SIGKILL after a timeout); True if it ran."""
    return processes.stop(
        pid,
        argv,
        sig=_STOP_SIGNALS[mode],
        timeout_s=_STOP_TIMEOUTS_S[mode],
        pid_path=pid_path(state_dir),
    )


def stop_signal(mode: StopMode) -> signal.Signals:
    """The signal ``mode`` sends to the postmaster."""
    return _STOP_SIGNALS[mode]


def _own(path: Path, user: processes.OsUser) -> None:
    if user.is_switch:
        os.chown(path, user.uid, user.gid)


def _reachable(folder: Path, user: processes.OsUser) -> bool:
    """True if ``user`` can enter and write ``folder`` (asked of the kernel, as that user)."""
    if not user.is_switch:
        return True
    argv = ["test", "-x", str(folder), "-a", "-w", str(folder)]
    return processes.run(argv, env=_ENV, cwd=Path("/"), user=user, timeout_s=10.0) == 0

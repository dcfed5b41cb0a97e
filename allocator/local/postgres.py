"""The PostgreSQL servers of the embedded cluster, run from the installed binaries.

Their folders, ``initdb`` and ``pg_basebackup``, starting a postmaster and stopping it by
pid. A dev/test server, no more: loopback only, ``trust`` authentication. Its settings are
:mod:`.pg_settings`; the SQL run against it once it serves is :mod:`.pg_sql`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import psycopg

from allocator.config import process_environment
from allocator.core import logs
from allocator.core.errors import PrerequisiteError, ServerStartError
from allocator.local import pg_settings, processes
from allocator.local.tcp_ports import LOOPBACK

log = logs.get_logger(__name__)

SERVER_OS_USER = "postgres"
BIN_DIR_ENV = "ALLOCATOR_PG_BIN_DIR"
DATABASE = "allocator"
INSTALL_HINT = "apt-get install postgresql-15"
SETTINGS_FILE = "allocator.conf"
READY_POLL_INTERVAL_S = 0.05
CONNECT_TIMEOUT_S = 2  # libpq's minimum
FIRST_SERVER = "pg"
STANDBY_SERVER = "pg-standby"

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
    then wherever ``initdb`` is on PATH. The error names the apt-get fix.
    """
    candidates: list[Path] = []
    if override is not None:
        candidates.append(override)
    elif env := process_environment().get(BIN_DIR_ENV):
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
    """The OS user the server runs as: ``postgres`` when we are root, else ourselves.

    PostgreSQL refuses to run as root. When we are root, ``initdb`` and ``postgres`` run as
    the OS user ``postgres``: ``<state>/pg`` is chown-ed to it, and the child process drops
    to its uid, gid and groups before ``exec`` (see :mod:`allocator.local.processes`), with
    ``/`` as working directory. The database superuser has the same name as that OS user.
    """
    if os.geteuid() != 0:
        return processes.OsUser.current()
    try:
        return processes.OsUser.lookup(SERVER_OS_USER)
    except KeyError:
        raise PrerequisiteError(
            f"PostgreSQL refuses to run as root and there is no OS user {SERVER_OS_USER!r} "
            f"to run it as: {INSTALL_HINT} (creates it), or useradd --system {SERVER_OS_USER}"
        ) from None


def pg_dir(state_dir: Path, server: str = FIRST_SERVER) -> Path:
    """``<state>/pg`` (the first server) or ``<state>/pg-standby``.

    It holds ``data/`` (``initdb``), ``postgres.log`` (the postmaster's stdout and stderr; no
    logging collector) and ``initdb.log``. The postmaster's pid is in ``cluster.json``
    (PostgreSQL's own ``data/postmaster.pid`` is PostgreSQL's business).
    """
    return state_dir / server


def log_path(state_dir: Path, server: str = FIRST_SERVER) -> Path:
    """The postmaster's log file."""
    return pg_dir(state_dir, server) / "postgres.log"


def database_url(user: str, port: int | Sequence[int], database: str = DATABASE) -> str:
    """``postgresql://<user>@127.0.0.1:<port>/<database>``.

    With several ports (a primary and its standby) the URL lists them all and asks for
    ``target_session_attrs=read-write``: libpq tries each in turn and keeps the one that
    takes writes, so clients follow a failover without being told.
    """
    many = [port] if isinstance(port, int) else list(port)
    hosts = ",".join(f"{LOOPBACK}:{p}" for p in many)
    query = "?target_session_attrs=read-write" if len(many) > 1 else ""
    return f"postgresql://{quote(user, safe='')}@{hosts}/{quote(database)}{query}"


def prepare_data_dir(state_dir: Path, user: processes.OsUser, server: str = FIRST_SERVER) -> Path:
    """Create ``<state>/<server>`` for ``user``; return the data folder the server will use.

    That is ``<state>/<server>/data`` when ``user`` can reach it, else a relocated folder
    that ``<state>/<server>/data`` links to: whatever state folder a user gives must work.
    If the ``postgres`` user cannot reach ``<state>/<server>`` (a parent folder is private,
    e.g. pytest's 0700 temp folders), the data folder is created with ``mkdtemp`` in the
    system temp folder, owned by ``postgres`` with mode 0700. We never loosen the
    permissions of the user's folders. ``allocator local down --purge`` removes the
    relocated folder too (:func:`relocated_data_dir`).
    """
    base = pg_dir(state_dir, server)
    base.mkdir(parents=True, exist_ok=True)
    _own(base, user)
    link = base / "data"
    if link.is_symlink():
        target = Path(os.readlink(link))
        if target.is_dir():
            return target
        log.warning("postgres_data_missing", link=link, target=target, note="initialising anew")
        link.unlink()
    elif link.exists() or _reachable(base, user):
        return link
    target = Path(tempfile.mkdtemp(prefix="allocator-pg-"))
    _own(target, user)
    link.symlink_to(target, target_is_directory=True)
    log.warning(
        "postgres_data_relocated",
        state=state_dir,
        data=target,
        note=f"OS user {user.name} cannot reach {base}",
    )
    return target


def relocated_data_dir(state_dir: Path, server: str = FIRST_SERVER) -> Path | None:
    """The folder ``<state>/<server>/data`` links to, if it was relocated."""
    link = pg_dir(state_dir, server) / "data"
    return Path(os.readlink(link)) if link.is_symlink() else None


def is_initialized(data_dir: Path) -> bool:
    """True if ``initdb`` has completed in ``data_dir``."""
    return (data_dir / "PG_VERSION").is_file()


def initdb(
    bin_dir: Path, state_dir: Path, data_dir: Path, user: processes.OsUser, superuser: str
) -> None:
    """Run ``initdb`` (UTF8, no locale, trust auth) as ``user``.

    ``trust`` is acceptable only because the server listens on 127.0.0.1 and has no Unix
    socket; any local user can connect as superuser. A failed ``initdb`` raises
    :class:`ServerStartError` with the log tail.
    """
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


def base_backup(
    bin_dir: Path,
    state_dir: Path,
    data_dir: Path,
    primary_port: int,
    superuser: str,
    user: processes.OsUser,
    *,
    server: str = STANDBY_SERVER,
) -> None:
    """Copy the primary into ``data_dir`` (``pg_basebackup``, WAL streamed) as a standby.

    A standby (``<state>/pg-standby/``, or the first server rebuilt after a failover) is
    that copy plus ``standby.signal``; it streams as
    :data:`~allocator.local.pg_settings.STANDBY_NAME`. Replication connections use the
    superuser over loopback (initdb's ``trust`` lines for ``replication``).
    """
    out = pg_dir(state_dir, server) / "basebackup.log"
    offset = out.stat().st_size if out.exists() else 0
    argv = [
        str(bin_dir / "pg_basebackup"),
        "-D",
        str(data_dir),
        "-h",
        LOOPBACK,
        "-p",
        str(primary_port),
        "-U",
        superuser,
        "--wal-method=stream",
        "--checkpoint=fast",
        "--no-password",
    ]
    code = processes.run(argv, log_path=out, env=_ENV, cwd=Path("/"), user=user)
    if code != 0:
        raise ServerStartError(
            f"pg_basebackup failed (exit {code}); last lines of {out}:\n"
            + processes.tail(out, offset=offset)
        )
    signal_file = data_dir / "standby.signal"
    signal_file.touch()
    _own(signal_file, user)


def write_settings(
    data_dir: Path,
    port: int,
    user: processes.OsUser,
    replication: Sequence[pg_settings.Setting] = (),
) -> None:
    """Write ``allocator.conf`` and include it from ``postgresql.conf`` (once).

    Rewritten at every start (:func:`start`): :func:`~.pg_settings.render_settings`.
    """
    settings = data_dir / SETTINGS_FILE
    settings.write_text(pg_settings.render_settings(port, replication))
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
    bin_dir: Path,
    state_dir: Path,
    data_dir: Path,
    port: int,
    user: processes.OsUser,
    *,
    server: str = FIRST_SERVER,
    replication: Sequence[pg_settings.Setting] = (),
) -> processes.Daemon:
    """Write the settings and start the postmaster as a daemon (not waiting for it).

    Started directly (``postgres -D``), so we hold its pid.
    """
    write_settings(data_dir, port, user, replication)
    daemon = processes.start(
        command(bin_dir, data_dir),
        log_path=log_path(state_dir, server),
        env=_ENV,
        cwd=Path("/"),
        user=user,
    )
    _own(log_path(state_dir, server), user)
    return daemon


def wait_ready(daemon: processes.Daemon, port: int, superuser: str, deadline: float) -> None:
    """Wait until a connection succeeds (ready); :class:`ServerStartError` with the log
    tail if not."""
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


def stop(pid: int | None, argv: list[str], mode: StopMode = "fast") -> bool:
    """Stop the postmaster with ``mode``'s signal (SIGKILL after a timeout); True if it ran.

    The signals ``pg_ctl`` sends: smart = SIGTERM, fast = SIGINT, immediate = SIGQUIT (no
    shutdown checkpoint; the next start runs crash recovery).
    """
    return processes.stop(pid, argv, sig=_STOP_SIGNALS[mode], timeout_s=_STOP_TIMEOUTS_S[mode])


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

"""The PostgreSQL server of the embedded cluster, run from the installed PostgreSQL binaries.

Rules:

- Layout: ``<state>/pg/`` holds ``data/`` (``initdb``), ``postgres.log`` (the postmaster's
  stdout and stderr; no logging collector) and ``initdb.log``. The postmaster's pid is in
  ``cluster.json`` (PostgreSQL's own ``data/postmaster.pid`` is PostgreSQL's business).
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
  ``unix_socket_directories=''``, ``max_connections=200``, and a documented block for a
  durable but fast claim path (:data:`CLAIM_PATH_SETTINGS`): ``fsync``,
  ``synchronous_commit`` and ``full_page_writes`` stay on (durability tests depend on them),
  group commit (``commit_delay=500``, ``commit_siblings=5``), 256MB shared buffers, 16MB WAL
  buffers, checkpoints by time (``max_wal_size=1GB``,
  ``checkpoint_timeout=5min``), ``wal_writer_delay=10ms``, ``autovacuum_naptime=10s``.
- The postmaster is a daemon started directly (``postgres -D``), so we hold its pid. Stop
  modes are the signals ``pg_ctl`` sends: smart = SIGTERM, fast = SIGINT, immediate =
  SIGQUIT (no shutdown checkpoint; the next start runs crash recovery).
- Ready = a psycopg connection succeeds. The ``allocator`` database is created if missing.
- A standby (``<state>/pg-standby/``, or the first server rebuilt after a failover) is a
  ``pg_basebackup`` of the primary plus ``standby.signal``; it streams with
  ``application_name`` :data:`STANDBY_NAME`. A primary lists that name in
  ``synchronous_standby_names`` once the standby exists, so with ``synchronous_commit = on``
  a commit waits for the standby's flush. Replication connections use the superuser over
  loopback (initdb's ``trust`` lines for ``replication``). Several servers' ports make a
  multi-host URL with ``target_session_attrs=read-write`` (:func:`database_url`).
- Login roles for the nodes and for applications (:func:`ensure_login_roles`) are created
  after the migrations, as members of the NOLOGIN groups the migrations create.
- Missing binaries raise :class:`PrerequisiteError` naming the apt-get fix; a failed
  ``initdb`` or start raises :class:`ServerStartError` with the log tail.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import psycopg
from psycopg import sql

from allocator import logs
from allocator.config import process_environment
from allocator.errors import LocalClusterError, PrerequisiteError, ServerStartError
from allocator.local import processes
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
STANDBY_NAME = "allocator_standby"
"""The standby's ``application_name``, which the primary's ``synchronous_standby_names`` names."""
PROMOTE_TIMEOUT_S = 60

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


def pg_dir(state_dir: Path, server: str = FIRST_SERVER) -> Path:
    """``<state>/pg`` (the first server) or ``<state>/pg-standby``."""
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
    that ``<state>/<server>/data`` links to (see the module rules).
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


_CONF_WIDTH = 96

# (setting, value, why); None as the setting starts a new commented group.
_Setting = tuple[str | None, str, str]

_SERVER_SETTINGS: tuple[_Setting, ...] = (
    (None, "", "Reachable from this machine only, over TCP; no Unix socket."),
    ("listen_addresses", "'127.0.0.1'", ""),
    ("unix_socket_directories", "''", ""),
    ("max_connections", "200", "nodes, consumers, tests and benchmark clients"),
    ("superuser_reserved_connections", "3", ""),
    ("work_mem", "'2MB'", ""),
    ("maintenance_work_mem", "'32MB'", ""),
    ("effective_cache_size", "'1GB'", "planner hint only; allocates nothing"),
    ("min_wal_size", "'32MB'", "little WAL kept around by an idle dev cluster"),
    ("huge_pages", "off", ""),
    (None, "", "Logs to stderr, i.e. <state>/pg/postgres.log; times in UTC."),
    ("logging_collector", "off", ""),
    ("log_destination", "'stderr'", ""),
    ("log_line_prefix", "'%m [%p] %q%u@%d '", ""),
    ("log_timezone", "'UTC'", ""),
    ("timezone", "'UTC'", ""),
)

# The claim path: durable, and as fast as a small (2-core) machine allows. Durability is not
# traded for speed: a claim that returned must survive a crash (DESIGN I4), and the chaos
# tests crash this server with `stop -m immediate` to prove it.
CLAIM_PATH_SETTINGS: tuple[_Setting, ...] = (
    (
        None,
        "",
        "Claim path: durable (DESIGN I4), tuned for throughput on a small (2-core) machine.",
    ),
    ("fsync", "on", "never off: a crash would lose or corrupt committed claims"),
    ("synchronous_commit", "on", "a commit returns only once its WAL is flushed"),
    ("full_page_writes", "on", "no torn pages after a crash mid-write"),
    (
        "commit_delay",
        "500",
        "group commit: with >= commit_siblings transactions open, wait 0.5 ms before the WAL "
        "flush so one fsync covers several claims (measured +5.5 % claims/s at 32 clients; "
        "2 ms was 17 % worse)",
    ),
    ("commit_siblings", "5", "only delay when enough other transactions could join the flush"),
    (
        "shared_buffers",
        "'256MB'",
        "the whole working set (blocks, ledger, indexes) stays in PostgreSQL's own cache, "
        "so a claim never waits for a read through the kernel",
    ),
    (
        "wal_buffers",
        "'16MB'",
        "room for the WAL of many concurrent claims and a leader's bulk cut between "
        "flushes, so a backend rarely has to write WAL out before its own commit flush",
    ),
    (
        "max_wal_size",
        "'1GB'",
        "checkpoints come from checkpoint_timeout, not from WAL volume during cutting "
        "bursts; fewer checkpoints mean fewer full-page images in the claims' WAL",
    ),
    (
        "checkpoint_timeout",
        "'5min'",
        "PostgreSQL's default, stated on purpose: with max_wal_size it bounds the WAL that "
        "crash recovery replays after an immediate stop",
    ),
    (
        "wal_writer_delay",
        "'10ms'",
        "the WAL writer wakes every 10 ms (default 200 ms) and writes out WAL in the "
        "background, so a committing claim finds less unwritten WAL ahead of its own",
    ),
    (
        "autovacuum_naptime",
        "'10s'",
        "claims update and retention deletes blocks all the time; autovacuum looks every "
        "10 s (default 1 min), so dead rows do not pile up where claims scan",
    ),
)


def render_settings(port: int, replication: Sequence[_Setting] = ()) -> str:
    """The text of ``allocator.conf``: each group of settings with a comment saying why.

    ``replication``: the settings of :func:`primary_settings` or :func:`standby_settings`.
    """
    lines = ["# Generated by `allocator local`; rewritten at every start. Loopback-only server."]
    settings = (
        *_SERVER_SETTINGS[:3],
        ("port", str(port), "recorded in cluster.json"),
        *_SERVER_SETTINGS[3:],
        *CLAIM_PATH_SETTINGS,
        *replication,
    )
    for key, value, why in settings:
        if key is None:
            lines += ["", f"# {why}"]
            continue
        line = f"{key} = {value}" + (f"  # {why}" if why else "")
        if len(line) > _CONF_WIDTH:  # a long reason goes above its setting, wrapped
            lines += [f"#   {part}" for part in textwrap.wrap(why, _CONF_WIDTH - 4)]
            line = f"{key} = {value}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def primary_settings(synchronous: bool) -> tuple[_Setting, ...]:
    """Replication settings of a primary; ``synchronous`` once its standby streams.

    With ``synchronous_standby_names`` set and ``synchronous_commit = on``, a commit returns
    only once the standby has flushed its WAL: a claim acknowledged by the primary survives
    its loss (DESIGN I4 across a failover). Until the standby exists (its base backup is
    taken from this very server) the primary commits alone.
    """
    names = f"'{STANDBY_NAME}'" if synchronous else "''"
    why = (
        "a commit waits until the standby has flushed its WAL"
        if synchronous
        else "no standby streams yet"
    )
    return (
        (None, "", "Replication: this server is the primary."),
        ("synchronous_standby_names", names, why),
    )


def standby_settings(primary_port: int, superuser: str) -> tuple[_Setting, ...]:
    """Replication settings of the standby, streaming from the primary on ``primary_port``."""
    conninfo = (
        f"host={LOOPBACK} port={primary_port} user={superuser} application_name={STANDBY_NAME}"
    )
    return (
        (None, "", "Replication: this server is a standby (standby.signal) until promoted."),
        ("primary_conninfo", f"'{conninfo}'", "ignored once promoted"),
        ("hot_standby", "on", "answers read-only queries, e.g. pg_is_in_recovery()"),
        ("synchronous_standby_names", "''", "after a promotion it commits alone"),
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
    """Copy the primary into ``data_dir`` (``pg_basebackup``, WAL streamed) as a standby."""
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


def _query_one(port: int, superuser: str, query: str, params: tuple[object, ...] = ()) -> Any:
    """The first row of ``query`` on the server on ``port`` (superuser, ``postgres`` database,
    autocommit); raises ``psycopg.Error``."""
    url = database_url(superuser, port, "postgres")
    with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
        return conn.execute(query, params).fetchone()


def in_recovery(port: int, superuser: str) -> bool | None:
    """``pg_is_in_recovery()`` of the server on ``port``; None if it does not answer."""
    try:
        row = _query_one(port, superuser, "SELECT pg_is_in_recovery()")
    except psycopg.Error:
        return None
    return bool(row[0]) if row else None


def sync_state(port: int, superuser: str) -> str | None:
    """How the primary on ``port`` sees its standby: ``sync``, ``async``, … or None."""
    try:
        row = _query_one(
            port,
            superuser,
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s"
            " AND state = 'streaming'",
            (STANDBY_NAME,),
        )
    except psycopg.Error:
        return None
    return str(row[0]) if row else None


def reload(port: int, superuser: str) -> None:
    """``pg_reload_conf()`` on the server on ``port`` (after :func:`write_settings`)."""
    try:
        _query_one(port, superuser, "SELECT pg_reload_conf()")
    except psycopg.Error as exc:
        raise LocalClusterError(f"could not reload PostgreSQL on port {port}") from exc


def wait_synchronous(port: int, superuser: str, deadline: float) -> None:
    """Wait until the primary on ``port`` streams to its standby synchronously."""
    while (state := sync_state(port, superuser)) != "sync":
        if time.monotonic() >= deadline:
            raise ServerStartError(
                f"the standby did not stream synchronously from the primary on port {port} "
                f"by its deadline (sync_state {state!r}); see its postgres.log"
            )
        time.sleep(READY_POLL_INTERVAL_S)


def promote(port: int, superuser: str) -> None:
    """Promote the standby on ``port`` (``pg_promote``, waiting until it accepts writes)."""
    try:
        row = _query_one(port, superuser, "SELECT pg_promote(true, %s)", (PROMOTE_TIMEOUT_S,))
    except psycopg.Error as exc:
        raise LocalClusterError(f"could not promote the standby on port {port}") from exc
    if not row or not row[0]:
        raise LocalClusterError(
            f"the standby on port {port} did not finish its promotion within {PROMOTE_TIMEOUT_S} s"
        )


def write_settings(
    data_dir: Path, port: int, user: processes.OsUser, replication: Sequence[_Setting] = ()
) -> None:
    """Write ``allocator.conf`` and include it from ``postgresql.conf`` (once)."""
    settings = data_dir / SETTINGS_FILE
    settings.write_text(render_settings(port, replication))
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
    replication: Sequence[_Setting] = (),
) -> processes.Daemon:
    """Write the settings and start the postmaster as a daemon (not waiting for it)."""
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


def stop(pid: int | None, argv: list[str], mode: StopMode = "fast") -> bool:
    """Stop the postmaster with ``mode``'s signal (SIGKILL after a timeout); True if it ran."""
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


def ensure_login_roles(
    port: int, superuser: str, roles: Sequence[tuple[str, str]], database: str = DATABASE
) -> list[str]:
    """Create each ``(login, group)`` login role ``IN ROLE group`` (idempotent).

    A group that does not exist yet (the migrations create them) is skipped; returns the
    login roles that exist afterwards. Authentication is the server's: ``trust`` on loopback.
    """
    url = database_url(superuser, port, database)
    present: list[str] = []
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            for login, group in roles:
                names = {
                    str(row[0])
                    for row in conn.execute(
                        "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", ([login, group],)
                    )
                }
                if group not in names:
                    log.info(
                        "login_role_skipped",
                        role=login,
                        group=group,
                        note="the group does not exist",
                    )
                    continue
                if login not in names:
                    with contextlib.suppress(psycopg.errors.DuplicateObject):  # a racing `up`
                        conn.execute(
                            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                                sql.Identifier(login), sql.Identifier(group)
                            )
                        )
                else:
                    conn.execute(
                        sql.SQL("GRANT {} TO {}").format(
                            sql.Identifier(group), sql.Identifier(login)
                        )
                    )
                present.append(login)
    except psycopg.Error as exc:
        raise LocalClusterError(f"could not create the login roles on port {port}") from exc
    return present

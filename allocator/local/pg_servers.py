"""The embedded cluster's PostgreSQL servers by their record: the primary, its synchronous
standby, and failover from one to the other."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from allocator.core import logs
from allocator.core.errors import LocalClusterError, UsageError
from allocator.local import pg_settings, pg_sql, postgres, processes, tcp_ports
from allocator.local.folder import StateFolder
from allocator.local.record import PRIMARY, RETIRED, STANDBY, PgRecord, Proc, State
from allocator.local.stopping import rollback

log = logs.get_logger(__name__)


def prerequisites(
    folder: StateFolder, state: State, bin_dir: Path | None
) -> tuple[Path, processes.OsUser]:
    """The binaries' folder (``bin_dir``, else found) and the OS user to run them as.

    That user must be the one who created the cluster, else :class:`LocalClusterError`.
    """
    found = postgres.find_bin_dir(bin_dir)
    user = postgres.server_user()
    if user.name != state.os_user:
        raise LocalClusterError(
            f"the PostgreSQL server in {folder.path} belongs to OS user {state.os_user!r}"
            f", but would now run as {user.name!r}; run as the user who created it"
        )
    return found, user


def want_standby(folder: StateFolder, state: State) -> None:
    """Record a standby to create: a new server, or the one a failover retired."""
    if state.live_standby() is not None:
        return
    retired = next((r for r in state.pg_servers() if r.role == RETIRED), None)
    if retired is not None:
        if retired.proc.alive():
            raise LocalClusterError(
                f"the retired PostgreSQL server (pid {retired.proc.pid}) still runs"
            )
        _discard_data(Path(retired.data_dir))
        retired.role = STANDBY
    else:
        port = tcp_ports.pick_free_ports_except(1, exclude=state.ports_in_use())[0]
        data_dir = postgres.pg_dir(folder.path, postgres.STANDBY_SERVER) / "data"
        state.standby = PgRecord(
            port, str(data_dir), Proc(), server=postgres.STANDBY_SERVER, role=STANDBY
        )
    folder.save(state)


def spawn(
    folder: StateFolder,
    state: State,
    record: PgRecord,
    bin_dir: Path,
    user: processes.OsUser,
) -> processes.Daemon:
    """Start ``record``'s server (``initdb`` first for a new primary, a base backup first
    for a new standby), not waiting for it, and record its pid.

    The primary waits for the standby's flush on every commit once the standby exists.
    """
    data_dir = postgres.prepare_data_dir(folder.path, user, record.server)
    if str(data_dir) != record.data_dir:
        record.data_dir = str(data_dir)
        folder.save(state)
    primary = state.primary()
    if record is primary:
        standby = state.live_standby()
        synchronous = standby is not None and postgres.is_initialized(Path(standby.data_dir))
        replication = pg_settings.primary_settings(synchronous)
        if not postgres.is_initialized(data_dir):
            postgres.initdb(bin_dir, folder.path, data_dir, user, state.superuser)
    else:
        replication = pg_settings.standby_settings(primary.port, state.superuser)
        if not postgres.is_initialized(data_dir):
            postgres.base_backup(
                bin_dir,
                folder.path,
                data_dir,
                primary.port,
                state.superuser,
                user,
                server=record.server,
            )
    daemon = postgres.start(
        bin_dir,
        folder.path,
        data_dir,
        record.port,
        user,
        server=record.server,
        replication=replication,
    )
    record.proc = Proc(daemon.pid, list(daemon.argv))
    folder.save(state)
    log.info("postgres_started", pid=daemon.pid, port=record.port, role=record.role)
    return daemon


def wait_primary(state: State, daemon: processes.Daemon, deadline: float) -> None:
    """Wait until the primary serves, then create the ``allocator`` database if missing."""
    primary = state.primary()
    postgres.wait_ready(daemon, primary.port, state.superuser, deadline)
    pg_sql.ensure_database(primary.port, state.superuser)


def start_standby(
    folder: StateFolder,
    state: State,
    standby: PgRecord,
    bin_dir: Path,
    user: processes.OsUser,
    *,
    deadline: float,
) -> None:
    """Start the standby (a base backup first), then make the primary wait for it.

    Returns once the standby streams synchronously (``sync``).
    """
    daemon = spawn(folder, state, standby, bin_dir, user)
    postgres.wait_ready(daemon, standby.port, state.superuser, deadline)
    primary = state.primary()
    postgres.write_settings(
        Path(primary.data_dir), primary.port, user, pg_settings.primary_settings(True)
    )
    pg_sql.reload(primary.port, state.superuser)
    pg_sql.wait_synchronous(primary.port, state.superuser, deadline)


def restart_primary(
    folder: StateFolder,
    state: State,
    bin_dir: Path,
    user: processes.OsUser,
    timeout_s: float,
) -> None:
    """Start the stopped primary on its recorded port and wait until it serves (or stop it)."""
    primary = state.primary()
    tcp_ports.ensure_free(primary.port, "PostgreSQL port")
    deadline = time.monotonic() + timeout_s
    try:
        daemon = spawn(folder, state, primary, bin_dir, user)
        wait_primary(state, daemon, deadline)
    except BaseException:
        rollback(folder, state, zk_ids=[], pg=[primary])
        raise


def failover(folder: StateFolder, state: State) -> None:
    """Kill the primary (``stop -m immediate``) and promote the standby in its place.

    The old primary is retired: never started again (its timeline ends where it died).
    """
    standby = state.live_standby()
    if standby is None:
        raise UsageError(
            f"the cluster in {folder.path} has no standby to promote: "
            f"`allocator local up --pg-standby --state-dir {folder.path}` adds one"
        )
    if not standby.proc.alive():
        raise LocalClusterError(
            f"the standby (port {standby.port}) is not running: `allocator local up "
            f"--state-dir {folder.path}` starts it"
        )
    old = state.primary()
    postgres.stop(old.proc.pid, old.proc.argv, "immediate")
    old.proc.forget_if_gone()
    if old.proc.pid is not None:
        raise LocalClusterError(f"the primary (pid {old.proc.pid}) did not stop")
    old.role = RETIRED
    folder.save(state)
    pg_sql.promote(standby.port, state.superuser)
    standby.role = PRIMARY
    folder.save(state)
    log.info("postgres_failover", retired_port=old.port, primary_port=standby.port)


def _discard_data(data_dir: Path) -> None:
    """Delete a retired server's data (a relocated folder stays linked, emptied)."""
    target = Path(os.readlink(data_dir)) if data_dir.is_symlink() else data_dir
    if target.is_dir():
        for child in target.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()

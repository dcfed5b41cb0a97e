"""The embedded cluster's ZooKeeper servers, one at a time, by their record: found, checked,
started and stopped."""

from __future__ import annotations

import signal
import time

from allocator.core import logs
from allocator.core.errors import UsageError
from allocator.local import processes, tcp_ports, zookeeper
from allocator.local.folder import StateFolder
from allocator.local.record import Proc, State, ZkRecord
from allocator.local.stopping import ZK_STOP_TIMEOUT_S, rollback

log = logs.get_logger(__name__)


def find(state: State, server_id: int) -> ZkRecord:
    """The record of server ``server_id``, or :class:`UsageError` naming the servers."""
    for record in state.zk:
        if record.server.id == server_id:
            return record
    ids = ", ".join(str(r.server.id) for r in state.zk)
    raise UsageError(f"no ZooKeeper server {server_id} in this cluster (servers: {ids})")


def check_ports(record: ZkRecord) -> None:
    """Raise :class:`~allocator.core.errors.PortInUseError` if one of the server's ports is
    taken."""
    server = record.server
    tcp_ports.ensure_free(server.client_port, f"ZooKeeper server {server.id} client port")
    tcp_ports.ensure_free(server.peer_port, f"ZooKeeper server {server.id} peer port")
    tcp_ports.ensure_free(server.election_port, f"ZooKeeper server {server.id} election port")


def spawn(
    folder: StateFolder, state: State, record: ZkRecord, runtime: zookeeper.Runtime
) -> processes.Daemon:
    """Start the server (not waiting for it) and record its pid."""
    servers = [r.server for r in state.zk]
    daemon = zookeeper.start(runtime, folder.path, record.server, servers, state.tick_ms)
    record.proc = Proc(daemon.pid, list(daemon.argv))
    folder.save(state)
    log.info("zookeeper_started", id=record.server.id, pid=daemon.pid)
    return daemon


def restart(
    folder: StateFolder,
    state: State,
    record: ZkRecord,
    runtime: zookeeper.Runtime,
    timeout_s: float,
) -> None:
    """Start a stopped server again on its recorded ports, stopping it again if that fails.

    Waits until it serves when the ensemble can have quorum with it, else only until it
    answers ``ruok``.
    """
    check_ports(record)
    others = sum(r.proc.alive() for r in state.zk if r is not record)
    need_quorum = others + 1 > len(state.zk) // 2
    deadline = time.monotonic() + timeout_s
    daemon = spawn(folder, state, record, runtime)
    try:
        zookeeper.wait_ready(daemon, record.server, deadline, need_quorum=need_quorum)
    except BaseException:
        rollback(folder, state, zk_ids=[record.server.id], pg=[])
        raise


def stop(folder: StateFolder, state: State, record: ZkRecord, *, kill: bool) -> None:
    """Stop the server: SIGKILL (a crash) with ``kill``, else SIGTERM."""
    processes.stop(
        record.proc.pid,
        record.proc.argv,
        sig=signal.SIGKILL if kill else signal.SIGTERM,
        timeout_s=ZK_STOP_TIMEOUT_S,
    )
    record.proc.forget_if_gone()
    folder.save(state)

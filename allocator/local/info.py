"""What ``up`` and ``status`` report about an embedded cluster (docs/design.md §10).

The report's types and their JSON, and :func:`read_info`, which reads them off the record
and the live processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from allocator.local import nodes as nodes_mod
from allocator.local import pg_sql, postgres, processes, zookeeper
from allocator.local.record import PRIMARY, STANDBY, PgRecord, State
from allocator.local.tcp_ports import LOOPBACK


@dataclass(frozen=True)
class ZkServerInfo:
    """One ZooKeeper server as ``status`` sees it; ``pid`` is None when it is not running."""

    id: int
    pid: int | None
    client_port: int
    peer_port: int
    election_port: int
    running: bool
    mode: str | None
    log: Path


@dataclass(frozen=True)
class PostgresInfo:
    """A PostgreSQL server as ``status`` sees it; ``pid`` is None when it is not running.

    ``role`` is what the record says (primary, standby, retired); ``in_recovery`` what the
    server says (``pg_is_in_recovery()``; None when it does not answer or was not asked);
    ``sync_state`` how the primary sees its standby (``sync``, ``async``, None: not
    streaming), on both servers' entries.
    """

    pid: int | None
    port: int
    running: bool
    superuser: str
    os_user: str
    data_dir: Path
    log: Path
    name: str = postgres.FIRST_SERVER
    role: str = "primary"
    in_recovery: bool | None = None
    sync_state: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "pid": self.pid,
            "port": self.port,
            "running": self.running,
            "in_recovery": self.in_recovery,
            "sync_state": self.sync_state,
            "superuser": self.superuser,
            "os_user": self.os_user,
            "data_dir": str(self.data_dir),
            "log": str(self.log),
        }


@dataclass(frozen=True)
class NodeInfo:
    """One allocator node as ``status`` sees it; ``pid`` is None when it is not running.

    ``state``: running, paused (SIGSTOPped), restarting (exited, restart pending), stopping,
    stopped (on request), down (no supervisor) or orphaned (no supervisor, still alive:
    ``down`` stops it). ``last_exit_code`` is negative for a signal (-9: SIGKILL).
    """

    name: str
    pid: int | None
    admin_address: str
    admin_url: str
    state: str
    restarts: int
    last_exit_code: int | None
    log: Path

    @property
    def running(self) -> bool:
        """True if the node process is alive (paused counts)."""
        return self.pid is not None

    def to_json(self) -> dict[str, Any]:
        """``{"name", "pid", "admin_url"}`` (docs/design.md §10) and more."""
        return {
            "name": self.name,
            "pid": self.pid,
            "admin_url": self.admin_url,
            "admin_address": self.admin_address,
            "state": self.state,
            "restarts": self.restarts,
            "last_exit_code": self.last_exit_code,
            "running": self.running,
            "log": str(self.log),
        }


@dataclass(frozen=True)
class ClusterInfo:
    """What ``up`` and ``status`` report; :meth:`to_json` has docs/design.md §10's keys.

    ``node_zk_hosts``, ``node_database_url`` are what the nodes use (the cluster's chroot,
    the ``allocator_node_login`` role); ``consumer_database_url`` is for applications
    (``allocator_app``, may only claim). ``admin_token`` authorises node admin actions: for
    in-process tools only, never in :meth:`to_json` (a shell reads it from ``cluster.json``,
    mode 0600). The URLs carry no password (``trust`` on loopback, :mod:`.postgres`).
    """

    state_dir: Path
    zk_hosts: str
    database_url: str
    zk_servers: tuple[ZkServerInfo, ...]
    postgres: PostgresInfo
    nodes: tuple[NodeInfo, ...]
    tick_ms: int
    node_zk_hosts: str = ""
    node_database_url: str = ""
    consumer_database_url: str = ""
    admin_token: str = field(default="", repr=False)
    zk_auth: str = field(default="", repr=False)
    """The nodes' ``zookeeper.auth``: every client of ``node_zk_hosts`` needs it. Kept in
    ``cluster.json`` (mode 0600), handed to the nodes in their environment, and never
    printed (not in :meth:`to_json`)."""
    session_timeout_ms: int = nodes_mod.DEFAULT_SESSION_TIMEOUT_MS
    supervisor_pid: int | None = None
    pg_servers: tuple[PostgresInfo, ...] = ()

    @property
    def running(self) -> bool:
        """True if every server is running (nodes aside: see each node's ``state``)."""
        return self.postgres.running and all(s.running for s in self.zk_servers)

    def to_json(self) -> dict[str, Any]:
        """``{"state_dir", "zk_hosts", "database_url", "zk_servers", "postgres", "nodes"}`` +."""
        return {
            "state_dir": str(self.state_dir),
            "zk_hosts": self.zk_hosts,
            "database_url": self.database_url,
            "zk_servers": [
                {
                    "id": s.id,
                    "pid": s.pid,
                    "client_port": s.client_port,
                    "peer_port": s.peer_port,
                    "election_port": s.election_port,
                    "running": s.running,
                    "mode": s.mode,
                    "log": str(s.log),
                }
                for s in self.zk_servers
            ],
            "postgres": self.postgres.to_json(),
            "pg_servers": [server.to_json() for server in self.pg_servers],
            "nodes": [node.to_json() for node in self.nodes],
            "node_zk_hosts": self.node_zk_hosts,
            "node_database_url": self.node_database_url,
            "consumer_database_url": self.consumer_database_url,
            "session_timeout_ms": self.session_timeout_ms,
            "supervisor_pid": self.supervisor_pid,
            "tick_ms": self.tick_ms,
            "running": self.running,
        }


def read_info(state_dir: Path, state: State) -> ClusterInfo:
    """What ``state`` records and what of it runs: every process checked, each ZooKeeper
    server's mode asked, PostgreSQL's replication asked where there is some."""
    servers = []
    for record in state.zk:
        running = record.proc.alive()
        server = record.server
        servers.append(
            ZkServerInfo(
                id=server.id,
                pid=record.proc.pid if running else None,
                client_port=server.client_port,
                peer_port=server.peer_port,
                election_port=server.election_port,
                running=running,
                mode=zookeeper.mode(server.client_port) if running else None,
                log=zookeeper.log_path(state_dir, server.id),
            )
        )
    pg_servers = tuple(_pg_server_info(state, r, state_dir) for r in state.pg_servers())
    pg_ports = state.pg_ports()
    return ClusterInfo(
        state_dir=state_dir,
        zk_hosts=state.zk_hosts(),
        database_url=postgres.database_url(state.superuser, pg_ports),
        zk_servers=tuple(servers),
        postgres=next(p for p in pg_servers if p.role == PRIMARY),
        pg_servers=pg_servers,
        nodes=_nodes_info(state_dir, state),
        tick_ms=state.tick_ms,
        node_zk_hosts=state.zk_hosts() + nodes_mod.DEFAULT_CHROOT,
        node_database_url=nodes_mod.login_url(
            nodes_mod.NODE_LOGIN_ROLE, pg_ports, postgres.DATABASE
        ),
        consumer_database_url=nodes_mod.login_url(
            nodes_mod.CONSUMER_LOGIN_ROLE, pg_ports, postgres.DATABASE
        ),
        admin_token=state.admin_token,
        zk_auth=state.zk_auth,
        session_timeout_ms=state.session_timeout_ms or nodes_mod.DEFAULT_SESSION_TIMEOUT_MS,
        supervisor_pid=state.supervisor.pid if state.supervisor.alive() else None,
    )


def read_node_info(state_dir: Path, state: State, name: str) -> NodeInfo:
    """:func:`read_info`'s entry of node ``name``."""
    return next(n for n in read_info(state_dir, state).nodes if n.name == name)


def _pg_server_info(state: State, record: PgRecord, state_dir: Path) -> PostgresInfo:
    running = record.proc.alive()
    replicated = state.standby is not None
    primary = state.primary()
    return PostgresInfo(
        pid=record.proc.pid if running else None,
        port=record.port,
        running=running,
        superuser=state.superuser,
        os_user=state.os_user,
        data_dir=Path(record.data_dir),
        log=postgres.log_path(state_dir, record.server),
        name=record.server,
        role=record.role,
        # Asked only where there is replication to tell about (status stays cheap).
        in_recovery=(
            pg_sql.in_recovery(record.port, state.superuser) if replicated and running else None
        ),
        sync_state=(
            pg_sql.sync_state(primary.port, state.superuser)
            if record.role == STANDBY and primary.proc.alive()
            else None
        ),
    )


def _nodes_info(state_dir: Path, state: State) -> tuple[NodeInfo, ...]:
    runtime = nodes_mod.read_runtime(state_dir)
    supervised = (
        state.supervisor.alive()
        and runtime is not None
        and runtime.supervisor_pid == state.supervisor.pid
    )
    infos = []
    for spec in state.nodes:
        record = runtime.node(spec.name) if runtime is not None else None
        alive = record is not None and record.alive()
        pid = record.pid if record is not None and alive else None
        if not supervised:
            node_state = nodes_mod.ORPHANED if alive else nodes_mod.DOWN
        elif record is None:
            node_state = nodes_mod.STOPPED
        elif alive and processes.is_paused(pid):
            node_state = nodes_mod.PAUSED
        elif record.state == nodes_mod.RUNNING and not alive:
            node_state = nodes_mod.RESTARTING  # exited; the supervisor is on it
        else:
            node_state = record.state
        infos.append(
            NodeInfo(
                name=spec.name,
                pid=pid,
                admin_address=f"{LOOPBACK}:{spec.admin_port}",
                admin_url=nodes_mod.admin_url(spec.admin_port),
                state=node_state,
                restarts=record.restarts if record is not None else 0,
                last_exit_code=record.last_exit_code if record is not None else None,
                log=nodes_mod.log_path(state_dir, spec.name),
            )
        )
    return tuple(infos)

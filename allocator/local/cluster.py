"""The embedded cluster: a ZooKeeper ensemble, PostgreSQL (a primary, optionally a
synchronous standby) and allocator nodes.

Rules:

- Everything lives in the state folder: ``cluster.json`` (the record), ``.lock``,
  ``zk/<id>/``, ``pg/``, ``nodes/`` and ``secrets/`` (written by
  :mod:`allocator.local.client_env`; see ``deploy/local/README.md``). Several clusters
  run side by side in different state folders; every port is picked free at creation and
  then recorded. A folder with no record (or none at all) is "no local cluster in DIR"; a
  path that cannot be a folder (under a file, a name too long) is "cannot use DIR as a
  state folder": both :class:`LocalClusterError`, never an ``OSError``.
- ``cluster.json`` is the one source of truth for what was started and what is wanted:
  ports, tick, OS user, for every server and for the node supervisor its pid and argv, and
  for every node its spec and desired state (:mod:`allocator.local.nodes`). It is rewritten
  atomically right after each process starts or stops, so another process (``allocator
  local status|down``), or a later ``up`` after a crash of the manager half-way, sees
  exactly what was started. A process counts as running only while its recorded pid still
  runs its recorded argv (:mod:`allocator.local.processes`). What the nodes do is in
  ``nodes/nodes.json``, written by the supervisor only.
- Commands that start or stop processes hold an exclusive ``flock`` on ``.lock``;
  ``status`` and ``signal_node`` only read.
- ``up`` is idempotent: live processes are left alone; dead ones restart on their recorded
  ports with their data kept; a recorded port now taken by someone else is an error naming
  the port; a ``zk_servers`` or ``tick_ms`` different from the recorded one is an error.
  Prerequisites and ports are checked before anything starts, and a failing server start
  stops what it started itself, so it leaves nothing half-running behind. Then migrations
  (optional), the login roles (``allocator_node_login``, ``allocator_app``; created when
  their groups exist), then the nodes' chroot ``/allocator`` with the cluster's ZooKeeper
  ACL, then the nodes.
- ZooKeeper ACLs by default: a new cluster gets a random digest identity (``zk_auth``),
  recorded in ``cluster.json`` (like the admin token; the record is written mode 0600) and
  given to the nodes as ``ALLOCATOR_ZOOKEEPER_AUTH`` in their environment, never on a
  command line. ``ClusterInfo.zk_auth`` hands it to in-process tools (demo, drill,
  tests); :meth:`ClusterInfo.to_json` never prints it.
- Nodes (``nodes`` > 0) run under a supervisor process (:mod:`allocator.local.supervisor`)
  that restarts any node that exits. Node settings (count, command, extra environment,
  session timeout) are recorded; ``up`` with other settings restarts the supervisor and its
  nodes with the new ones. ``up`` also starts every node that was stopped on request, and
  returns once the supervisor has started every node (not waiting for them to serve).
- ``down`` stops by pid: the supervisor first (it stops its nodes: SIGTERM, SIGKILL after
  their shutdown timeout + 2 s, 12 s by default), then any node still alive that
  ``nodes.json`` lists (the supervisor was killed), then PostgreSQL (fast shutdown), then
  ZooKeeper (SIGTERM, all at once), SIGKILL after a timeout. A pid is forgotten only once
  its process is confirmed gone: what could not be stopped (no permission, survived
  SIGKILL) stays recorded and ``down`` raises after trying everything else, so a later
  ``down`` retries it. ``down`` is harmless when nothing runs
  and keeps the data unless ``purge``; purging removes only what the cluster created, never
  other files in the state folder.
- PostgreSQL servers have a recorded role: ``primary`` (exactly one), ``standby`` (made by
  ``pg_standby``), ``retired`` (a primary a failover left behind: never started again, as
  it would be a second primary on an abandoned timeline, until ``pg_standby`` rebuilds it
  as the standby). The primary waits for the standby's flush on every commit once the
  standby streams (``up`` waits for ``sync``). Every URL handed out lists all the servers'
  ports with ``target_session_attrs=read-write``, in a fixed order, so it never changes
  across a failover. ``pg_failover`` kills the primary (``immediate``) and promotes the
  standby.
- Use as a context manager in tests: ``with LocalCluster(dir) as cluster:`` runs ``up`` and
  always ``down``, also when ``up`` fails half-way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from allocator import logs
from allocator.config import process_environment
from allocator.errors import LocalClusterError, ServerStartError, UsageError
from allocator.local import nodes as nodes_mod
from allocator.local import pg_settings, pg_sql, postgres, processes, tcp_ports, zookeeper
from allocator.local.postgres import StopMode
from allocator.local.tcp_ports import LOOPBACK

log = logs.get_logger(__name__)

STATE_FILE = "cluster.json"
LOCK_FILE = ".lock"
STATE_VERSION = 1
DEFAULT_ZK_SERVERS = 3
MAX_ZK_SERVERS = 7
DEFAULT_START_TIMEOUT_S = 60.0
LOCK_TIMEOUT_S = 120.0
LOCK_POLL_INTERVAL_S = 0.05
ZK_STOP_TIMEOUT_S = 10.0
# On top of the nodes' stop timeout: the supervisor's SIGKILL wait, then its own exit.
SUPERVISOR_STOP_MARGIN_S = nodes_mod.KILL_TIMEOUT_S + 5.0
ROLLBACK_STOP_TIMEOUT_S = 5.0
MAX_NODES = 32
APPLY_POLL_INTERVAL_S = 0.05
LOGIN_ROLES = (
    (nodes_mod.NODE_LOGIN_ROLE, "allocator_node"),
    (nodes_mod.CONSUMER_LOGIN_ROLE, "allocator_consumer"),
)
MIN_CLIENT_CHECK_S = 5.0
SECRETS_DIR = "secrets"
"""``<state>/secrets/``: the cluster's secrets one per file, for ``*_FILE`` variables."""
_CREATED_SUBTREES = ("zk", postgres.FIRST_SERVER, postgres.STANDBY_SERVER, "nodes", SECRETS_DIR)


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
        """``{"name", "pid", "admin_url"}`` (DESIGN §10) and more."""
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
    """What ``up`` and ``status`` report; :meth:`to_json` has DESIGN §10's keys.

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


@dataclass
class _Proc:
    pid: int | None = None
    argv: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        return processes.is_alive(self.pid, self.argv)


@dataclass
class _ZkRecord:
    server: zookeeper.Server
    proc: _Proc


PRIMARY = "primary"
STANDBY = "standby"
RETIRED = "retired"
"""A primary that a failover left behind: never started again (it would be a second
primary on an old timeline); ``down --purge`` removes it."""


@dataclass
class _PgRecord:
    port: int
    data_dir: str
    proc: _Proc
    server: str = postgres.FIRST_SERVER
    role: str = PRIMARY

    def to_json(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "data_dir": self.data_dir,
            "pid": self.proc.pid,
            "argv": self.proc.argv,
            "server": self.server,
            "role": self.role,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any], server: str) -> _PgRecord:
        role = str(raw.get("role", PRIMARY))
        if role not in (PRIMARY, STANDBY, RETIRED):
            raise ValueError(f"unknown PostgreSQL role {role!r}")
        return cls(
            int(raw["port"]),
            str(raw["data_dir"]),
            _Proc(raw["pid"], [str(a) for a in raw["argv"]]),
            server=str(raw.get("server", server)),
            role=role,
        )


@dataclass
class _State:
    tick_ms: int
    superuser: str
    os_user: str
    zk: list[_ZkRecord]
    postgres: _PgRecord
    created_at: str
    admin_token: str
    nodes: list[nodes_mod.NodeSpec] = field(default_factory=list)
    zk_auth: str = ""
    """The cluster's ZooKeeper digest identity ``user:password`` (``zookeeper.auth``)."""
    node_generation: int = 0
    supervisor: _Proc = field(default_factory=_Proc)
    # Node settings as asked for; None: the default (resolved when the specs are built).
    node_command: list[str] | None = None
    node_env: dict[str, str] = field(default_factory=dict)
    session_timeout_ms: int | None = None
    standby: _PgRecord | None = None

    def pg_servers(self) -> list[_PgRecord]:
        """The PostgreSQL servers: the first one, then the standby if there is one."""
        return [self.postgres] + ([self.standby] if self.standby is not None else [])

    def primary(self) -> _PgRecord:
        """The server that takes writes (the standby once a failover promoted it)."""
        for record in self.pg_servers():
            if record.role == PRIMARY:
                return record
        raise LocalClusterError("the cluster record names no PostgreSQL primary")

    def live_standby(self) -> _PgRecord | None:
        """The server in the standby role, if any (none after a failover, until rebuilt)."""
        return next((r for r in self.pg_servers() if r.role == STANDBY), None)

    def pg_ports(self) -> list[int]:
        """Every server's port, in a fixed order: clients' multi-host URLs list them all."""
        return [record.port for record in self.pg_servers()]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "created_at": self.created_at,
            "tick_ms": self.tick_ms,
            "superuser": self.superuser,
            "os_user": self.os_user,
            "zk": [
                {
                    "id": r.server.id,
                    "client_port": r.server.client_port,
                    "peer_port": r.server.peer_port,
                    "election_port": r.server.election_port,
                    "pid": r.proc.pid,
                    "argv": r.proc.argv,
                }
                for r in self.zk
            ],
            "postgres": self.postgres.to_json(),
            "pg_standby": self.standby.to_json() if self.standby is not None else None,
            "admin_token": self.admin_token,
            "zk_auth": self.zk_auth,
            "node_command": self.node_command,
            "node_env": self.node_env,
            "session_timeout_ms": self.session_timeout_ms,
            "supervisor": {"pid": self.supervisor.pid, "argv": self.supervisor.argv},
            "node_generation": self.node_generation,
            "nodes": [spec.to_json() for spec in self.nodes],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> _State:
        if raw.get("version") != STATE_VERSION:
            raise ValueError(f"unknown record version {raw.get('version')!r}")
        pg = raw["postgres"]
        supervisor = raw.get("supervisor") or {}
        command = raw.get("node_command")
        timeout = raw.get("session_timeout_ms")
        return cls(
            tick_ms=int(raw["tick_ms"]),
            superuser=str(raw["superuser"]),
            os_user=str(raw["os_user"]),
            zk=[
                _ZkRecord(
                    zookeeper.Server(
                        int(z["id"]),
                        int(z["client_port"]),
                        int(z["peer_port"]),
                        int(z["election_port"]),
                    ),
                    _Proc(z["pid"], [str(a) for a in z["argv"]]),
                )
                for z in raw["zk"]
            ],
            postgres=_PgRecord.from_json(pg, postgres.FIRST_SERVER),
            standby=(
                _PgRecord.from_json(raw["pg_standby"], postgres.STANDBY_SERVER)
                if raw.get("pg_standby")
                else None
            ),
            created_at=str(raw.get("created_at", "")),
            # Records from before the nodes had none; one is made up when nodes first start.
            admin_token=str(raw.get("admin_token", "")),
            # Records from before ZooKeeper ACLs had none; one is made up at the next `up`.
            zk_auth=str(raw.get("zk_auth", "")),
            nodes=[nodes_mod.NodeSpec.from_json(n) for n in raw.get("nodes", [])],
            node_generation=int(raw.get("node_generation", 0)),
            supervisor=_Proc(supervisor.get("pid"), [str(a) for a in supervisor.get("argv", [])]),
            node_command=[str(a) for a in command] if command is not None else None,
            node_env={str(k): str(v) for k, v in dict(raw.get("node_env") or {}).items()},
            session_timeout_ms=int(timeout) if timeout is not None else None,
        )


class LocalCluster:
    """Manager of one embedded cluster in ``state_dir``; see the module rules.

    ``zk_servers`` and ``tick_ms`` apply when the cluster is created (None: the recorded
    values, or 3 servers and 200 ms for a new one). ``pg_port``/``zk_client_ports`` request
    specific ports for a new cluster instead of free ones. ``zk_java_dir`` (or
    ``$ALLOCATOR_ZK_JAVA_DIR``) is where the ZooKeeper jars are; ``pg_bin_dir`` (or
    ``$ALLOCATOR_PG_BIN_DIR``) the PostgreSQL binaries; ``zk_jvm_options`` are added to the
    java command line.

    Nodes: ``nodes`` is how many ``up`` runs unless it is told otherwise (None: as
    recorded, none for a new cluster); ``node_command`` the argv of each node (None: as
    recorded, else ``python -m allocator.cli run``); ``node_env`` extra variables for every
    node, e.g. ``{"ALLOCATOR_POOL_MIN_BLOCKS": "8"}`` (None: as recorded);
    ``session_timeout_ms`` the nodes' ZooKeeper session timeout (None: as recorded, else
    4000 ms).

    ``pg_standby``: add a synchronous streaming standby to PostgreSQL if there is none (also
    to rebuild the one a failover retired); :meth:`pg_failover` promotes it.
    """

    def __init__(
        self,
        state_dir: Path | str,
        zk_servers: int | None = None,
        *,
        tick_ms: int | None = None,
        pg_port: int | None = None,
        zk_client_ports: Sequence[int] | None = None,
        zk_java_dir: Path | None = None,
        pg_bin_dir: Path | None = None,
        zk_jvm_options: Sequence[str] = (),
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        migrate_on_enter: bool = True,
        purge_on_exit: bool = False,
        nodes: int | None = None,
        node_command: Sequence[str] | None = None,
        node_env: Mapping[str, str] | None = None,
        session_timeout_ms: int | None = None,
        pg_standby: bool = False,
    ) -> None:
        if zk_servers is None and zk_client_ports is not None:
            zk_servers = len(zk_client_ports)
        if zk_servers is not None and not (
            1 <= zk_servers <= MAX_ZK_SERVERS and zk_servers % 2 == 1
        ):
            raise UsageError(
                f"zk servers must be an odd number from 1 to {MAX_ZK_SERVERS}, not {zk_servers}"
            )
        if zk_client_ports is not None and len(zk_client_ports) != zk_servers:
            raise UsageError(
                f"{len(zk_client_ports)} ZooKeeper client ports given for {zk_servers} servers"
            )
        if tick_ms is not None and tick_ms < 1:
            raise UsageError(f"tick must be at least 1 ms, not {tick_ms}")
        _check_node_count(nodes)
        if node_command is not None and not node_command:
            raise UsageError("the node command must not be empty")
        if session_timeout_ms is not None and session_timeout_ms < 1:
            raise UsageError(f"session timeout must be at least 1 ms, not {session_timeout_ms}")
        self.state_dir = Path(state_dir).expanduser().resolve()
        self._zk_servers = zk_servers
        self._tick_ms = tick_ms
        self._pg_port = pg_port
        self._zk_client_ports = tuple(zk_client_ports) if zk_client_ports is not None else None
        self._zk_java_dir = zk_java_dir
        self._pg_bin_dir = pg_bin_dir
        self._zk_jvm_options = tuple(zk_jvm_options)
        self._start_timeout_s = start_timeout_s
        self._migrate_on_enter = migrate_on_enter
        self._purge_on_exit = purge_on_exit
        self._nodes = nodes
        self._node_command = list(node_command) if node_command is not None else None
        try:
            self._node_env = (
                nodes_mod.validate_extra_env(node_env) if node_env is not None else None
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        self._session_timeout_ms = session_timeout_ms
        self._pg_standby = pg_standby

    # -- public API -------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        """``<state>/cluster.json``."""
        return self.state_dir / STATE_FILE

    def exists(self) -> bool:
        """True if a cluster is recorded in the state folder."""
        try:
            return self.state_file.is_file()
        except OSError as exc:  # e.g. a name too long: no cluster can be recorded there
            raise self._unusable(exc) from exc

    def up(self, migrate: bool = True, nodes: int | None = None) -> ClusterInfo:
        """Start whatever is not running, wait until it serves, apply migrations, start nodes.

        ``nodes`` is how many nodes to run (None: the constructor's, else as recorded, none
        for a new cluster); ``0`` stops any.
        """
        _check_node_count(nodes)
        count = nodes if nodes is not None else self._nodes
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # under a file, a name too long, no permission
            raise self._unusable(exc) from exc
        with self._locked():
            state = self._load()
            if state is None:
                state = self._new_state()
            else:
                self._check_request(state)
            if self._pg_standby:
                self._want_standby(state)
            self._start_missing(state)
            primary = state.primary()
            if migrate:
                _apply_migrations(postgres.database_url(state.superuser, state.pg_ports()))
            pg_sql.ensure_login_roles(primary.port, state.superuser, LOGIN_ROLES)
            self._start_nodes(state, count)
            return self._info(state)

    def status(self) -> ClusterInfo:
        """What is recorded and what of it runs (ZooKeeper modes included)."""
        return self._info(self._require_state())

    def down(self, purge: bool = False) -> None:
        """Stop every recorded process by pid; with ``purge`` also delete the cluster's data."""
        if not self.exists():
            return  # never lock or purge a folder that holds no cluster
        with self._locked():
            state = self._load()
            if state is not None:
                self._stop_everything(state)
                if purge:
                    self._purge(state)

    def stop_node(self, name: str, *, kill: bool = False) -> NodeInfo:
        """Stop node ``name`` and keep it stopped (SIGTERM, or SIGKILL with ``kill``).

        The supervisor does it and never restarts it until :meth:`start_node` (or ``up``).
        """
        with self._locked():
            state = self._require_state()
            spec = _node_spec(state, name)
            self._require_supervisor(state)
            spec.run = False
            spec.stop_signal = "SIGKILL" if kill else "SIGTERM"
            self._request_nodes(state, _nodes_stop_timeout_s(state))
            return self._node_info(state, name)

    def start_node(self, name: str) -> NodeInfo:
        """Start node ``name`` again after :meth:`stop_node` (no-op if it runs)."""
        with self._locked():
            state = self._require_state()
            spec = _node_spec(state, name)
            self._require_supervisor(state)
            spec.run = True
            self._request_nodes(state, self._start_timeout_s)
            return self._node_info(state, name)

    def signal_node(self, name: str, sig: signal.Signals | str) -> int:
        """Send ``sig`` (SIGSTOP, SIGCONT, SIGKILL or SIGTERM) to node ``name``; its pid.

        A drill: after SIGKILL or SIGTERM the supervisor restarts the node as after any
        exit; after SIGSTOP it stays paused (alive) until SIGCONT.
        """
        try:
            signum = nodes_mod.signal_by_name(sig) if isinstance(sig, str) else sig
        except KeyError:
            signum = None
        if signum is None or signum.name not in nodes_mod.DRILL_SIGNALS:
            raise UsageError(f"node signals are {', '.join(nodes_mod.DRILL_SIGNALS)}, not {sig}")
        state = self._require_state()
        _node_spec(state, name)
        runtime = nodes_mod.read_runtime(self.state_dir)
        record = runtime.node(name) if runtime is not None else None
        if record is None or record.pid is None or not record.alive():
            raise LocalClusterError(f"{name} is not running (see `allocator local status`)")
        if not processes.send_signal(record.pid, record.argv, signum, record.started):
            raise LocalClusterError(f"{name} (pid {record.pid}) exited before {signum.name}")
        log.info("node_signalled", name=name, pid=record.pid, signal=signum.name)
        return record.pid

    def stop_zk(self, server_id: int, *, kill: bool = True) -> None:
        """Stop one ZooKeeper server: SIGKILL (a crash) by default, else SIGTERM."""
        with self._locked():
            state = self._require_state()
            record = _zk_record(state, server_id)
            processes.stop(
                record.proc.pid,
                record.proc.argv,
                sig=signal.SIGKILL if kill else signal.SIGTERM,
                timeout_s=ZK_STOP_TIMEOUT_S,
            )
            _forget_if_gone(record.proc)
            self._save(state)

    def start_zk(self, server_id: int) -> None:
        """Restart one ZooKeeper server on its recorded ports (no-op if it runs).

        Waits until it serves when the ensemble can have quorum with it, else only until it
        answers ``ruok``.
        """
        with self._locked():
            state = self._require_state()
            record = _zk_record(state, server_id)
            if record.proc.alive():
                return
            runtime = self._zk_runtime()
            _check_zk_ports(record)
            others = sum(r.proc.alive() for r in state.zk if r is not record)
            need_quorum = others + 1 > len(state.zk) // 2
            deadline = time.monotonic() + self._start_timeout_s
            daemon = self._spawn_zk(state, record, runtime)
            try:
                zookeeper.wait_ready(daemon, record.server, deadline, need_quorum=need_quorum)
            except BaseException:
                self._rollback(state, zk_ids=[server_id], pg=[])
                raise

    def stop_postgres(self, mode: StopMode = "fast") -> None:
        """Stop PostgreSQL: ``fast`` (SIGINT), ``immediate`` (SIGQUIT) or ``smart`` (SIGTERM)."""
        if mode not in postgres.STOP_MODES:
            raise UsageError(
                f"unknown stop mode {mode!r} (one of {', '.join(postgres.STOP_MODES)})"
            )
        with self._locked():
            state = self._require_state()
            primary = state.primary()
            postgres.stop(primary.proc.pid, primary.proc.argv, mode)
            _forget_if_gone(primary.proc)
            self._save(state)

    def pg_failover(self) -> ClusterInfo:
        """Kill the primary (``stop -m immediate``) and promote the standby in its place.

        The old primary is retired: never started again (its timeline ends where it died).
        Clients with the cluster's multi-host URLs reach the new primary on their next
        connection. ``up --pg-standby`` rebuilds the retired server as the new standby.
        """
        with self._locked():
            state = self._require_state()
            standby = state.live_standby()
            if standby is None:
                raise UsageError(
                    f"the cluster in {self.state_dir} has no standby to promote: "
                    f"`allocator local up --pg-standby --state-dir {self.state_dir}` adds one"
                )
            if not standby.proc.alive():
                raise LocalClusterError(
                    f"the standby (port {standby.port}) is not running: `allocator local up "
                    f"--state-dir {self.state_dir}` starts it"
                )
            old = state.primary()
            postgres.stop(old.proc.pid, old.proc.argv, "immediate")
            _forget_if_gone(old.proc)
            if old.proc.pid is not None:
                raise LocalClusterError(f"the primary (pid {old.proc.pid}) did not stop")
            old.role = RETIRED
            self._save(state)
            pg_sql.promote(standby.port, state.superuser)
            standby.role = PRIMARY
            self._save(state)
            log.info("postgres_failover", retired_port=old.port, primary_port=standby.port)
            return self._info(state)

    def start_postgres(self) -> None:
        """Start PostgreSQL on its recorded port (no-op if it runs) and wait until it serves."""
        with self._locked():
            state = self._require_state()
            primary = state.primary()
            if primary.proc.alive():
                return
            bin_dir, user = self._pg_prerequisites(state)
            tcp_ports.ensure_free(primary.port, "PostgreSQL port")
            deadline = time.monotonic() + self._start_timeout_s
            try:
                daemon = self._spawn_pg(state, primary, bin_dir, user)
                self._wait_pg(state, daemon, deadline)
            except BaseException:
                self._rollback(state, zk_ids=[], pg=[primary])
                raise

    def __enter__(self) -> LocalCluster:
        try:
            self.up(migrate=self._migrate_on_enter)
        except BaseException:
            with contextlib.suppress(Exception):
                self.down(purge=self._purge_on_exit)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down(purge=self._purge_on_exit)

    # -- starting ---------------------------------------------------------------------------

    def _new_state(self) -> _State:
        count = self._zk_servers or DEFAULT_ZK_SERVERS
        requested: list[tuple[int, str]] = []
        if self._zk_client_ports is not None:
            requested += [
                (p, f"ZooKeeper server {i} client port")
                for i, p in enumerate(self._zk_client_ports, 1)
            ]
        if self._pg_port is not None:
            requested.append((self._pg_port, "PostgreSQL port"))
        numbers = [p for p, _ in requested]
        if len(set(numbers)) != len(numbers):
            raise UsageError(f"the requested ports are not distinct: {numbers}")
        for port, what in requested:
            tcp_ports.ensure_free(port, what)
        free = iter(_pick_ports(3 * count + 1 - len(requested), exclude=set(numbers)))
        client_ports = self._zk_client_ports or tuple(next(free) for _ in range(count))
        servers = [
            zookeeper.Server(i, client_ports[i - 1], next(free), next(free))
            for i in range(1, count + 1)
        ]
        pg_port = self._pg_port if self._pg_port is not None else next(free)
        user = postgres.server_user()
        return _State(
            tick_ms=self._tick_ms or zookeeper.DEFAULT_TICK_MS,
            superuser=user.name,
            os_user=user.name,
            zk=[_ZkRecord(s, _Proc()) for s in servers],
            postgres=_PgRecord(pg_port, str(postgres.pg_dir(self.state_dir) / "data"), _Proc()),
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            admin_token=_new_token(),
            zk_auth=_new_zk_auth(),
        )

    def _check_request(self, state: _State) -> None:
        recorded = len(state.zk)
        if self._zk_servers is not None and self._zk_servers != recorded:
            raise LocalClusterError(
                f"the cluster in {self.state_dir} has {recorded} ZooKeeper server(s), not "
                f"{self._zk_servers}; use --zk {recorded}, or `allocator local down --purge` "
                "first to create a new one"
            )
        if self._tick_ms is not None and self._tick_ms != state.tick_ms:
            raise LocalClusterError(
                f"the cluster in {self.state_dir} was created with a {state.tick_ms} ms tick, "
                f"not {self._tick_ms}; `allocator local down --purge` first to change it"
            )

    def _want_standby(self, state: _State) -> None:
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
            taken = set(state.pg_ports()) | {
                p
                for r in state.zk
                for p in (r.server.client_port, r.server.peer_port, r.server.election_port)
            }
            taken |= {spec.admin_port for spec in state.nodes}
            port = _pick_ports(1, exclude=taken)[0]
            data_dir = postgres.pg_dir(self.state_dir, postgres.STANDBY_SERVER) / "data"
            state.standby = _PgRecord(
                port, str(data_dir), _Proc(), server=postgres.STANDBY_SERVER, role=STANDBY
            )
        self._save(state)

    def _start_missing(self, state: _State) -> None:
        zk_todo = [r for r in state.zk if not r.proc.alive()]
        primary = state.primary()
        pg_todo = not primary.proc.alive()
        standby = state.live_standby()
        standby_todo = standby is not None and not standby.proc.alive()
        if not zk_todo and not pg_todo and not standby_todo:
            return
        # Everything that can fail without side effects comes first.
        runtime = self._zk_runtime() if zk_todo else None
        pg_needs = self._pg_prerequisites(state) if pg_todo or standby_todo else None
        for record in zk_todo:
            _check_zk_ports(record)
        if pg_todo:
            tcp_ports.ensure_free(primary.port, "PostgreSQL port")
        if standby is not None and standby_todo:
            tcp_ports.ensure_free(standby.port, "PostgreSQL standby port")
        self._save(state)
        deadline = time.monotonic() + self._start_timeout_s
        started_zk: list[int] = []
        pg_started: list[_PgRecord] = []
        pg_daemon: processes.Daemon | None = None
        try:
            daemons: list[tuple[_ZkRecord, processes.Daemon]] = []
            for record in zk_todo:
                assert runtime is not None
                daemons.append((record, self._spawn_zk(state, record, runtime)))
                started_zk.append(record.server.id)
            if pg_needs is not None and pg_todo:
                # initdb and the PostgreSQL start overlap the ZooKeeper election.
                pg_started.append(primary)
                pg_daemon = self._spawn_pg(state, primary, *pg_needs)
            for record, daemon in daemons:
                zookeeper.wait_ready(daemon, record.server, deadline, need_quorum=True)
            if pg_daemon is not None:
                self._wait_pg(state, pg_daemon, deadline)
            if pg_needs is not None and standby is not None and standby_todo:
                pg_started.append(standby)
                self._start_standby(state, standby, *pg_needs, deadline=deadline)
            if daemons:
                remaining = max(MIN_CLIENT_CHECK_S, deadline - time.monotonic())
                zookeeper.check_client(_zk_hosts(state), remaining)
        except BaseException:
            self._rollback(state, zk_ids=started_zk, pg=pg_started)
            raise

    def _spawn_zk(
        self, state: _State, record: _ZkRecord, runtime: zookeeper.Runtime
    ) -> processes.Daemon:
        servers = [r.server for r in state.zk]
        daemon = zookeeper.start(runtime, self.state_dir, record.server, servers, state.tick_ms)
        record.proc = _Proc(daemon.pid, list(daemon.argv))
        self._save(state)
        log.info("zookeeper_started", id=record.server.id, pid=daemon.pid)
        return daemon

    def _spawn_pg(
        self, state: _State, record: _PgRecord, bin_dir: Path, user: processes.OsUser
    ) -> processes.Daemon:
        """Start ``record``'s server (``initdb`` first for a new primary)."""
        data_dir = postgres.prepare_data_dir(self.state_dir, user, record.server)
        if str(data_dir) != record.data_dir:
            record.data_dir = str(data_dir)
            self._save(state)
        primary = state.primary()
        if record is primary:
            standby = state.live_standby()
            synchronous = standby is not None and postgres.is_initialized(Path(standby.data_dir))
            replication = pg_settings.primary_settings(synchronous)
            if not postgres.is_initialized(data_dir):
                postgres.initdb(bin_dir, self.state_dir, data_dir, user, state.superuser)
        else:
            replication = pg_settings.standby_settings(primary.port, state.superuser)
            if not postgres.is_initialized(data_dir):
                postgres.base_backup(
                    bin_dir,
                    self.state_dir,
                    data_dir,
                    primary.port,
                    state.superuser,
                    user,
                    server=record.server,
                )
        daemon = postgres.start(
            bin_dir,
            self.state_dir,
            data_dir,
            record.port,
            user,
            server=record.server,
            replication=replication,
        )
        record.proc = _Proc(daemon.pid, list(daemon.argv))
        self._save(state)
        log.info("postgres_started", pid=daemon.pid, port=record.port, role=record.role)
        return daemon

    def _wait_pg(self, state: _State, daemon: processes.Daemon, deadline: float) -> None:
        primary = state.primary()
        postgres.wait_ready(daemon, primary.port, state.superuser, deadline)
        pg_sql.ensure_database(primary.port, state.superuser)

    def _start_standby(
        self,
        state: _State,
        standby: _PgRecord,
        bin_dir: Path,
        user: processes.OsUser,
        *,
        deadline: float,
    ) -> None:
        """Start the standby (a base backup first), then make the primary wait for it."""
        daemon = self._spawn_pg(state, standby, bin_dir, user)
        postgres.wait_ready(daemon, standby.port, state.superuser, deadline)
        primary = state.primary()
        postgres.write_settings(
            Path(primary.data_dir), primary.port, user, pg_settings.primary_settings(True)
        )
        pg_sql.reload(primary.port, state.superuser)
        pg_sql.wait_synchronous(primary.port, state.superuser, deadline)

    def _rollback(self, state: _State, *, zk_ids: Sequence[int], pg: Sequence[_PgRecord]) -> None:
        """Stop what a failed start began (best effort; the original error is what matters)."""
        try:
            for server in pg:
                processes.stop(
                    server.proc.pid,
                    server.proc.argv,
                    sig=postgres.stop_signal("immediate"),
                    timeout_s=ROLLBACK_STOP_TIMEOUT_S,
                )
            records = [r for r in state.zk if r.server.id in zk_ids]
            processes.stop_all(
                [(r.proc.pid, r.proc.argv) for r in records if r.proc.pid is not None],
                timeout_s=ROLLBACK_STOP_TIMEOUT_S,
            )
        except Exception:
            log.exception("rollback_failed", state=self.state_dir)
        finally:
            for server in state.pg_servers():
                _forget_if_gone(server.proc)
            for record in state.zk:
                _forget_if_gone(record.proc)
            self._save(state)

    def _zk_runtime(self) -> zookeeper.Runtime:
        return zookeeper.find_runtime(self._zk_java_dir, self._zk_jvm_options)

    def _pg_prerequisites(self, state: _State) -> tuple[Path, processes.OsUser]:
        bin_dir = postgres.find_bin_dir(self._pg_bin_dir)
        user = postgres.server_user()
        if user.name != state.os_user:
            raise LocalClusterError(
                f"the PostgreSQL server in {self.state_dir} belongs to OS user {state.os_user!r}"
                f", but would now run as {user.name!r}; run as the user who created it"
            )
        return bin_dir, user

    # -- nodes ------------------------------------------------------------------------------

    def _start_nodes(self, state: _State, count: int | None) -> None:
        """Bring the nodes to ``count`` (None: as recorded), all running; see the rules."""
        if self._node_command is not None:
            state.node_command = list(self._node_command)
        if self._node_env is not None:
            state.node_env = dict(self._node_env)
        if self._session_timeout_ms is not None:
            state.session_timeout_ms = self._session_timeout_ms
        wanted = self._node_specs(state, len(state.nodes) if count is None else count)
        supervising = state.supervisor.alive()
        if supervising and nodes_mod.specs_differ(state.nodes, wanted):
            log.info("nodes_reconfigured", state=self.state_dir, note="restarting the supervisor")
            self._stop_supervisor(state)
            supervising = False
        state.nodes = wanted
        # The nodes' chroot exists whatever the count, so node_zk_hosts works for nodes
        # started by hand (``allocator run``) next to a cluster brought up with none. A
        # running supervisor's nodes made it already.
        if not state.zk_auth:
            state.zk_auth = _new_zk_auth()
        if not supervising:
            zookeeper.ensure_chroot(
                _zk_hosts(state), nodes_mod.DEFAULT_CHROOT, state.zk_auth, self._start_timeout_s
            )
        if not wanted:
            self._save(state)
            return
        if supervising:
            self._request_nodes(state, self._start_timeout_s)
            return
        # Nodes a killed supervisor left behind would hold the admin ports (and a name).
        nodes_mod.stop_recorded(self.state_dir, _nodes_stop_timeout_s(state))
        for spec in wanted:
            tcp_ports.ensure_free(spec.admin_port, f"{spec.name} admin port")
        state.node_generation += 1
        self._save(state)
        daemon = processes.start(
            nodes_mod.supervisor_command(self.state_dir),
            log_path=nodes_mod.supervisor_log_path(self.state_dir),
            env=nodes_mod.base_env(process_environment()),
            cwd=self.state_dir,
        )
        state.supervisor = _Proc(daemon.pid, list(daemon.argv))
        self._save(state)
        log.info("supervisor_started", pid=daemon.pid, nodes=len(wanted))
        try:
            self._wait_applied(state, self._start_timeout_s)
        except BaseException:
            with contextlib.suppress(Exception):
                self._stop_supervisor(state)
            raise

    def _node_specs(self, state: _State, count: int) -> list[nodes_mod.NodeSpec]:
        """Specs of ``node-1``… ``node-<count>``, all to run; recorded admin ports are kept."""
        timeout_ms = state.session_timeout_ms or nodes_mod.DEFAULT_SESSION_TIMEOUT_MS
        bounds = zookeeper.limits(state.tick_ms)
        if count and not bounds["minSessionTimeout"] <= timeout_ms <= bounds["maxSessionTimeout"]:
            raise UsageError(
                f"a session timeout of {timeout_ms} ms is outside what this cluster's ZooKeeper "
                f"grants ({bounds['minSessionTimeout']}..{bounds['maxSessionTimeout']} ms at a "
                f"{state.tick_ms} ms tick)"
            )
        if count and not state.admin_token:
            state.admin_token = _new_token()
        recorded = {spec.name: spec.admin_port for spec in state.nodes}
        names = [nodes_mod.node_name(i) for i in range(1, count + 1)]
        taken = set(recorded.values()) | set(state.pg_ports())
        for record in state.zk:
            server = record.server
            taken |= {server.client_port, server.peer_port, server.election_port}
        fresh = iter(_pick_ports(sum(n not in recorded for n in names), exclude=taken))
        argv = state.node_command or nodes_mod.default_command()
        zk_hosts = _zk_hosts(state) + nodes_mod.DEFAULT_CHROOT
        db_url = nodes_mod.login_url(nodes_mod.NODE_LOGIN_ROLE, state.pg_ports(), postgres.DATABASE)
        specs = []
        for name in names:
            port = recorded[name] if name in recorded else next(fresh)
            env = nodes_mod.node_env(
                name=name,
                zk_hosts=zk_hosts,
                postgres_url=db_url,
                admin_port=port,
                admin_token=state.admin_token,
                zk_auth=state.zk_auth,
                session_timeout_ms=timeout_ms,
                state_dir=nodes_mod.node_state_dir(self.state_dir, name),
                extra=state.node_env,
            )
            specs.append(nodes_mod.NodeSpec(name, port, list(argv), env))
        return specs

    def _request_nodes(self, state: _State, timeout_s: float) -> None:
        """Publish the changed desired states and wait until the supervisor carried them out."""
        state.node_generation += 1
        self._save(state)
        self._wait_applied(state, timeout_s)

    def _wait_applied(self, state: _State, timeout_s: float) -> nodes_mod.Runtime:
        sup = state.supervisor
        deadline = time.monotonic() + timeout_s
        log_path = nodes_mod.supervisor_log_path(self.state_dir)
        while True:
            runtime = nodes_mod.read_runtime(self.state_dir)
            if (
                runtime is not None
                and runtime.supervisor_pid == sup.pid
                and runtime.applied_generation >= state.node_generation
            ):
                return runtime
            if not sup.alive():
                raise ServerStartError(
                    f"the node supervisor (pid {sup.pid}) exited; last lines of {log_path}:\n"
                    + processes.tail(log_path)
                )
            if time.monotonic() >= deadline:
                raise LocalClusterError(
                    f"the node supervisor (pid {sup.pid}) did not carry out the request within "
                    f"{timeout_s:.0f} s; see {log_path}"
                )
            time.sleep(APPLY_POLL_INTERVAL_S)

    def _require_supervisor(self, state: _State) -> None:
        if not state.supervisor.alive():
            raise LocalClusterError(
                f"the nodes of {self.state_dir} are not supervised (cluster down, or the "
                f"supervisor was killed): `allocator local up --state-dir {self.state_dir}` "
                "starts them"
            )

    def _node_info(self, state: _State, name: str) -> NodeInfo:
        return next(n for n in self._info(state).nodes if n.name == name)

    def _nodes_info(self, state: _State) -> tuple[NodeInfo, ...]:
        runtime = nodes_mod.read_runtime(self.state_dir)
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
                    log=nodes_mod.log_path(self.state_dir, spec.name),
                )
            )
        return tuple(infos)

    # -- stopping ---------------------------------------------------------------------------

    def _stop_everything(self, state: _State) -> None:
        failures: list[str] = []
        first: Exception | None = None

        def attempt(what: str, action: Callable[[], object]) -> None:
            nonlocal first
            try:
                action()
            except Exception as exc:
                log.exception("stop_failed", what=what)
                failures.append(f"{what}: {exc}")
                first = first or exc

        attempt("the node supervisor", lambda: self._stop_supervisor(state))
        # Whatever a killed supervisor left behind (or a failed stop above).
        attempt(
            "nodes",
            lambda: nodes_mod.stop_recorded(self.state_dir, _nodes_stop_timeout_s(state)),
        )
        # The primary first: its fast shutdown sends the standby all of its WAL.
        pg_servers = sorted(state.pg_servers(), key=lambda r: r.role != PRIMARY)
        for server in pg_servers:
            attempt(
                f"PostgreSQL {server.server} ({server.role})"
                if len(pg_servers) > 1
                else "PostgreSQL",
                lambda s=server: postgres.stop(s.proc.pid, s.proc.argv, "fast"),  # type: ignore[misc]
            )
        zk_targets: list[processes.Target] = [
            (r.proc.pid, r.proc.argv) for r in state.zk if r.proc.pid is not None
        ]
        attempt("ZooKeeper", lambda: processes.stop_all(zk_targets, timeout_s=ZK_STOP_TIMEOUT_S))
        # Forget only the pids whose process is confirmed gone: the others stay recorded so
        # that a later `down` retries them (nodes.json keeps the nodes' pids the same way).
        for proc in (state.supervisor, *(s.proc for s in pg_servers), *(r.proc for r in state.zk)):
            _forget_if_gone(proc)
        self._save(state)
        if failures:
            raise LocalClusterError(
                "could not stop " + "; ".join(failures) + " (still recorded: `allocator local "
                f"down --state-dir {self.state_dir}` retries)"
            ) from first

    def _stop_supervisor(self, state: _State) -> None:
        """SIGTERM the supervisor (it stops its nodes); SIGKILL it and its nodes if it hangs."""
        sup = state.supervisor
        processes.stop(sup.pid, sup.argv, timeout_s=_nodes_stop_timeout_s(state))
        _forget_if_gone(sup)
        self._save(state)

    def _purge(self, state: _State) -> None:
        for server in state.pg_servers():
            relocated = postgres.relocated_data_dir(self.state_dir, server.server)
            if relocated is not None:
                shutil.rmtree(relocated, ignore_errors=True)
        for name in _CREATED_SUBTREES:
            shutil.rmtree(self.state_dir / name, ignore_errors=True)
        for name in (STATE_FILE, LOCK_FILE):
            with contextlib.suppress(FileNotFoundError):
                (self.state_dir / name).unlink()
        with contextlib.suppress(OSError):
            self.state_dir.rmdir()  # only if nothing else is in it
        log.info("cluster_purged", state=self.state_dir, zk_servers=len(state.zk))

    # -- the record -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        path = self.state_dir / LOCK_FILE
        try:
            handle = path.open("a")
        except (FileNotFoundError, NotADirectoryError):
            self._require_state()  # no folder, so no cluster recorded: say that
            raise
        except OSError as exc:
            raise self._unusable(exc) from exc
        with handle:
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LocalClusterError(
                            f"another `allocator local` command holds {path}"
                        ) from None
                    time.sleep(LOCK_POLL_INTERVAL_S)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _load(self) -> _State | None:
        try:
            text = self.state_file.read_text()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._unusable(exc) from exc
        try:
            return _State.from_json(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            raise LocalClusterError(
                f"{self.state_file} is not a valid cluster record ({exc}); stop the processes "
                "it lists by their pids, then remove it"
            ) from exc

    def _unusable(self, exc: OSError) -> LocalClusterError:
        return LocalClusterError(
            f"cannot use {self.state_dir} as a state folder: {exc.strerror or exc}"
        )

    def _require_state(self) -> _State:
        state = self._load()
        if state is None:
            raise LocalClusterError(
                f"no local cluster in {self.state_dir}: start one with "
                f"`allocator local up --state-dir {self.state_dir}`"
            )
        return state

    def _save(self, state: _State) -> None:
        # Mode 0600: the record holds the cluster's secrets (admin token, ZooKeeper identity).
        tmp = self.state_file.with_name(STATE_FILE + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # a leftover could carry wider permissions
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(state.to_json(), indent=2) + "\n")
        tmp.replace(self.state_file)

    def _pg_info(self, state: _State) -> tuple[PostgresInfo, ...]:
        return tuple(_pg_server_info(state, r, self.state_dir) for r in state.pg_servers())

    def _info(self, state: _State) -> ClusterInfo:
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
                    log=zookeeper.log_path(self.state_dir, server.id),
                )
            )
        pg_servers = self._pg_info(state)
        pg_ports = state.pg_ports()
        return ClusterInfo(
            state_dir=self.state_dir,
            zk_hosts=_zk_hosts(state),
            database_url=postgres.database_url(state.superuser, pg_ports),
            zk_servers=tuple(servers),
            postgres=next(p for p in pg_servers if p.role == PRIMARY),
            pg_servers=pg_servers,
            nodes=self._nodes_info(state),
            tick_ms=state.tick_ms,
            node_zk_hosts=_zk_hosts(state) + nodes_mod.DEFAULT_CHROOT,
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


def _pg_server_info(state: _State, record: _PgRecord, state_dir: Path) -> PostgresInfo:
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


def _zk_hosts(state: _State) -> str:
    return ",".join(f"{LOOPBACK}:{r.server.client_port}" for r in state.zk)


def _node_spec(state: _State, name: str) -> nodes_mod.NodeSpec:
    for spec in state.nodes:
        if spec.name == name:
            return spec
    names = ", ".join(spec.name for spec in state.nodes) or "none"
    raise UsageError(f"no node {name!r} in this cluster (nodes: {names})")


def _nodes_stop_timeout_s(state: _State) -> float:
    """Long enough for the supervisor to stop every node (and SIGKILL the stubborn)."""
    longest = max((s.stop_timeout_s for s in state.nodes), default=nodes_mod.STOP_TIMEOUT_S)
    return longest + SUPERVISOR_STOP_MARGIN_S


def _check_node_count(count: int | None) -> None:
    if count is not None and not 0 <= count <= MAX_NODES:
        raise UsageError(f"nodes must be from 0 to {MAX_NODES}, not {count}")


def _forget_if_gone(proc: _Proc) -> None:
    """Clear a recorded pid once its process is confirmed gone (never before)."""
    if not proc.alive():
        proc.pid = None


def _discard_data(data_dir: Path) -> None:
    """Delete a retired server's data (a relocated folder stays linked, emptied)."""
    target = Path(os.readlink(data_dir)) if data_dir.is_symlink() else data_dir
    if target.is_dir():
        for child in target.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def _new_token() -> str:
    return secrets.token_urlsafe(24)


def _new_zk_auth() -> str:
    """A random digest identity ``allocator-<hex>:<password>`` for one cluster."""
    return f"allocator-{secrets.token_hex(4)}:{secrets.token_urlsafe(24)}"


def _zk_record(state: _State, server_id: int) -> _ZkRecord:
    for record in state.zk:
        if record.server.id == server_id:
            return record
    ids = ", ".join(str(r.server.id) for r in state.zk)
    raise UsageError(f"no ZooKeeper server {server_id} in this cluster (servers: {ids})")


def _check_zk_ports(record: _ZkRecord) -> None:
    server = record.server
    tcp_ports.ensure_free(server.client_port, f"ZooKeeper server {server.id} client port")
    tcp_ports.ensure_free(server.peer_port, f"ZooKeeper server {server.id} peer port")
    tcp_ports.ensure_free(server.election_port, f"ZooKeeper server {server.id} election port")


def _pick_ports(count: int, exclude: set[int]) -> list[int]:
    """``count`` distinct free ports, none of them in ``exclude``."""
    picked = [p for p in tcp_ports.pick_free_ports(count + len(exclude)) if p not in exclude]
    return picked[:count]


def _apply_migrations(database_url: str) -> None:
    """``allocator.migrate.upgrade_to_head``; imported here so status/down skip Alembic."""
    from allocator import migrate

    migrate.upgrade_to_head(database_url)

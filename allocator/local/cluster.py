"""The embedded cluster's manager, :class:`LocalCluster`: a ZooKeeper ensemble, PostgreSQL
(a primary, optionally a synchronous standby) and allocator nodes in one state folder; each
concern is a module of its own (record, folder, info, zk_ensemble, pg_servers, supervision,
stopping).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from allocator.core.errors import LocalClusterError, UsageError
from allocator.local import nodes as nodes_mod
from allocator.local import (
    pg_servers,
    pg_sql,
    postgres,
    processes,
    stopping,
    supervision,
    tcp_ports,
    zk_ensemble,
    zookeeper,
)
from allocator.local.folder import StateFolder
from allocator.local.info import ClusterInfo, NodeInfo, read_info, read_node_info
from allocator.local.postgres import StopMode
from allocator.local.record import PgRecord, State, ZkRecord, new_state

MAX_ZK_SERVERS = 7
DEFAULT_START_TIMEOUT_S = 60.0
MAX_NODES = 32
LOGIN_ROLES = (
    (nodes_mod.NODE_LOGIN_ROLE, "allocator_node"),
    (nodes_mod.CONSUMER_LOGIN_ROLE, "allocator_consumer"),
)
MIN_CLIENT_CHECK_S = 5.0


class LocalCluster:
    """Manager of one embedded cluster in ``state_dir`` (:class:`~.folder.StateFolder`).

    Use as a context manager in tests: ``with LocalCluster(dir) as cluster:`` runs ``up``
    and always ``down``, also when ``up`` fails half-way. Commands that start or stop
    processes hold the folder's lock; ``status`` and ``signal_node`` only read.

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
        self._folder = StateFolder(self.state_dir)
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

    @property
    def state_file(self) -> Path:
        """``<state>/cluster.json``."""
        return self._folder.state_file

    def exists(self) -> bool:
        """True if a cluster is recorded in the state folder."""
        return self._folder.exists()

    def up(self, migrate: bool = True, nodes: int | None = None) -> ClusterInfo:
        """Start whatever is not running, wait until it serves, apply migrations, start nodes.

        ``nodes`` is how many nodes to run (None: the constructor's, else as recorded, none
        for a new cluster); ``0`` stops any.

        Idempotent: live processes are left alone; dead ones restart on their recorded
        ports with their data kept; a recorded port now taken by someone else is an error
        naming the port; a ``zk_servers`` or ``tick_ms`` different from the recorded one is
        an error. Prerequisites and ports are checked before anything starts, and a failing
        server start stops what it started itself. Then migrations (``migrate``), the login
        roles (:data:`LOGIN_ROLES`; created when their groups exist), then the nodes
        (:func:`.supervision.start_nodes`).
        """
        _check_node_count(nodes)
        count = nodes if nodes is not None else self._nodes
        self._folder.create()
        with self._folder.locked():
            state = self._folder.load()
            if state is None:
                state = new_state(
                    self.state_dir,
                    zk_servers=self._zk_servers,
                    tick_ms=self._tick_ms,
                    zk_client_ports=self._zk_client_ports,
                    pg_port=self._pg_port,
                )
            else:
                self._check_request(state)
            if self._pg_standby:
                pg_servers.want_standby(self._folder, state)
            self._start_missing(state)
            primary = state.primary()
            if migrate:
                _apply_migrations(postgres.database_url(state.superuser, state.pg_ports()))
            pg_sql.ensure_login_roles(primary.port, state.superuser, LOGIN_ROLES)
            supervision.start_nodes(
                self._folder,
                state,
                count,
                command=self._node_command,
                env=self._node_env,
                session_timeout_ms=self._session_timeout_ms,
                timeout_s=self._start_timeout_s,
            )
            return read_info(self.state_dir, state)

    def status(self) -> ClusterInfo:
        """What is recorded and what of it runs (ZooKeeper modes included)."""
        return read_info(self.state_dir, self._folder.require())

    def down(self, purge: bool = False) -> None:
        """Stop every recorded process by pid (:func:`.stopping.stop_everything`); with
        ``purge`` also delete the cluster's data (:meth:`.StateFolder.purge`).

        Harmless when nothing runs; keeps the data unless ``purge``.
        """
        if not self.exists():
            return  # never lock or purge a folder that holds no cluster
        with self._folder.locked():
            state = self._folder.load()
            if state is not None:
                stopping.stop_everything(self._folder, state)
                if purge:
                    self._folder.purge(state)

    def stop_node(self, name: str, *, kill: bool = False) -> NodeInfo:
        """Stop node ``name`` and keep it stopped (SIGTERM, or SIGKILL with ``kill``).

        The supervisor does it and never restarts it until :meth:`start_node` (or ``up``).
        """
        with self._folder.locked():
            state = self._folder.require()
            spec = supervision.find_spec(state, name)
            supervision.require_supervisor(self._folder, state)
            spec.run = False
            spec.stop_signal = "SIGKILL" if kill else "SIGTERM"
            supervision.request(self._folder, state, stopping.nodes_stop_timeout_s(state))
            return read_node_info(self.state_dir, state, name)

    def start_node(self, name: str) -> NodeInfo:
        """Start node ``name`` again after :meth:`stop_node` (no-op if it runs)."""
        with self._folder.locked():
            state = self._folder.require()
            spec = supervision.find_spec(state, name)
            supervision.require_supervisor(self._folder, state)
            spec.run = True
            supervision.request(self._folder, state, self._start_timeout_s)
            return read_node_info(self.state_dir, state, name)

    def signal_node(self, name: str, sig: signal.Signals | str) -> int:
        """Send ``sig`` (SIGSTOP, SIGCONT, SIGKILL or SIGTERM) to node ``name``; its pid.

        A drill: after SIGKILL or SIGTERM the supervisor restarts the node as after any
        exit; after SIGSTOP it stays paused (alive) until SIGCONT.
        """
        return supervision.send_signal(self._folder, name, sig)

    def stop_zk(self, server_id: int, *, kill: bool = True) -> None:
        """Stop one ZooKeeper server: SIGKILL (a crash) by default, else SIGTERM."""
        with self._folder.locked():
            state = self._folder.require()
            zk_ensemble.stop(self._folder, state, zk_ensemble.find(state, server_id), kill=kill)

    def start_zk(self, server_id: int) -> None:
        """Restart one ZooKeeper server on its recorded ports (no-op if it runs).

        Waits until it serves when the ensemble can have quorum with it, else only until it
        answers ``ruok``.
        """
        with self._folder.locked():
            state = self._folder.require()
            record = zk_ensemble.find(state, server_id)
            if record.proc.alive():
                return
            runtime = self._zk_runtime()
            zk_ensemble.restart(self._folder, state, record, runtime, self._start_timeout_s)

    def stop_postgres(self, mode: StopMode = "fast") -> None:
        """Stop PostgreSQL: ``fast`` (SIGINT), ``immediate`` (SIGQUIT) or ``smart`` (SIGTERM)."""
        if mode not in postgres.STOP_MODES:
            raise UsageError(
                f"unknown stop mode {mode!r} (one of {', '.join(postgres.STOP_MODES)})"
            )
        with self._folder.locked():
            state = self._folder.require()
            primary = state.primary()
            postgres.stop(primary.proc.pid, primary.proc.argv, mode)
            primary.proc.forget_if_gone()
            self._folder.save(state)

    def pg_failover(self) -> ClusterInfo:
        """Kill the primary (``stop -m immediate``) and promote the standby in its place.

        The old primary is retired: never started again (its timeline ends where it died).
        Clients with the cluster's multi-host URLs reach the new primary on their next
        connection. ``up --pg-standby`` rebuilds the retired server as the new standby.
        """
        with self._folder.locked():
            state = self._folder.require()
            pg_servers.failover(self._folder, state)
            return read_info(self.state_dir, state)

    def start_postgres(self) -> None:
        """Start PostgreSQL on its recorded port (no-op if it runs) and wait until it serves."""
        with self._folder.locked():
            state = self._folder.require()
            if state.primary().proc.alive():
                return
            bin_dir, user = pg_servers.prerequisites(self._folder, state, self._pg_bin_dir)
            pg_servers.restart_primary(self._folder, state, bin_dir, user, self._start_timeout_s)

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

    def _check_request(self, state: State) -> None:
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

    def _start_missing(self, state: State) -> None:
        """Start every server that is not running and wait until each serves, or stop them.

        initdb and the PostgreSQL start overlap the ZooKeeper election; the standby starts
        once the primary serves.
        """
        zk_todo = [r for r in state.zk if not r.proc.alive()]
        primary = state.primary()
        pg_todo = not primary.proc.alive()
        standby = state.live_standby()
        standby_todo = standby is not None and not standby.proc.alive()
        if not zk_todo and not pg_todo and not standby_todo:
            return
        # Everything that can fail without side effects comes first.
        runtime = self._zk_runtime() if zk_todo else None
        pg_needs = (
            pg_servers.prerequisites(self._folder, state, self._pg_bin_dir)
            if pg_todo or standby_todo
            else None
        )
        for record in zk_todo:
            zk_ensemble.check_ports(record)
        if pg_todo:
            tcp_ports.ensure_free(primary.port, "PostgreSQL port")
        if standby is not None and standby_todo:
            tcp_ports.ensure_free(standby.port, "PostgreSQL standby port")
        self._folder.save(state)
        deadline = time.monotonic() + self._start_timeout_s
        started_zk: list[int] = []
        pg_started: list[PgRecord] = []
        pg_daemon: processes.Daemon | None = None
        try:
            daemons: list[tuple[ZkRecord, processes.Daemon]] = []
            for record in zk_todo:
                assert runtime is not None
                daemons.append((record, zk_ensemble.spawn(self._folder, state, record, runtime)))
                started_zk.append(record.server.id)
            if pg_needs is not None and pg_todo:
                pg_started.append(primary)
                pg_daemon = pg_servers.spawn(self._folder, state, primary, *pg_needs)
            for record, daemon in daemons:
                zookeeper.wait_ready(daemon, record.server, deadline, need_quorum=True)
            if pg_daemon is not None:
                pg_servers.wait_primary(state, pg_daemon, deadline)
            if pg_needs is not None and standby is not None and standby_todo:
                pg_started.append(standby)
                pg_servers.start_standby(self._folder, state, standby, *pg_needs, deadline=deadline)
            if daemons:
                remaining = max(MIN_CLIENT_CHECK_S, deadline - time.monotonic())
                zookeeper.check_client(state.zk_hosts(), remaining)
        except BaseException:
            stopping.rollback(self._folder, state, zk_ids=started_zk, pg=pg_started)
            raise

    def _zk_runtime(self) -> zookeeper.Runtime:
        return zookeeper.find_runtime(self._zk_java_dir, self._zk_jvm_options)


def _check_node_count(count: int | None) -> None:
    if count is not None and not 0 <= count <= MAX_NODES:
        raise UsageError(f"nodes must be from 0 to {MAX_NODES}, not {count}")


def _apply_migrations(database_url: str) -> None:
    """``allocator.migrate.upgrade_to_head``; imported here so status/down skip Alembic."""
    from allocator.postgres import migrate

    migrate.upgrade_to_head(database_url)

"""The embedded cluster: a ZooKeeper ensemble and a PostgreSQL server under one state folder.

Rules:

- Everything lives in the state folder: ``cluster.json`` (the record), ``.lock``,
  ``zk/<id>/`` and ``pg/`` (see ``deploy/local/README.md``). Several clusters run side by side
  in different state folders; every port is picked free at creation and then recorded.
- ``cluster.json`` is the one source of truth: ports, tick, OS user, and for every process
  its pid and argv. It is rewritten atomically right after each process starts or stops, so
  another process (``allocator local status|down``), or a later ``up`` after a crash of the
  manager half-way, sees exactly what was started. A process counts as running only while
  its recorded pid still runs its recorded argv (:mod:`allocator.local.processes`).
- Commands that start or stop processes hold an exclusive ``flock`` on ``.lock``;
  ``status`` only reads.
- ``up`` is idempotent: live processes are left alone; dead ones restart on their recorded
  ports with their data kept; a recorded port now taken by someone else is an error naming
  the port; a ``zk_servers`` or ``tick_ms`` different from the recorded one is an error.
  Prerequisites and ports are checked before anything starts, and a failing ``up`` stops
  what it started itself, so it leaves nothing half-running behind.
- ``down`` stops by pid, nodes first (none yet; ``nodes`` stays an empty list), then
  PostgreSQL (fast shutdown), then ZooKeeper (SIGTERM, all at once), SIGKILL after a timeout.
  It is harmless when nothing runs and keeps the data unless ``purge``; purging removes only
  what the cluster created, never other files in the state folder.
- Use as a context manager in tests: ``with LocalCluster(dir) as cluster:`` runs ``up`` and
  always ``down``, also when ``up`` fails half-way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from allocator.errors import LocalClusterError, UsageError
from allocator.local import ports, postgres, processes, zookeeper
from allocator.local.ports import LOOPBACK
from allocator.local.postgres import StopMode

log = logging.getLogger(__name__)

STATE_FILE = "cluster.json"
LOCK_FILE = ".lock"
STATE_VERSION = 1
DEFAULT_ZK_SERVERS = 3
MAX_ZK_SERVERS = 7
DEFAULT_START_TIMEOUT_S = 60.0
LOCK_TIMEOUT_S = 120.0
LOCK_POLL_INTERVAL_S = 0.05
ZK_STOP_TIMEOUT_S = 10.0
NODE_STOP_TIMEOUT_S = 15.0
ROLLBACK_STOP_TIMEOUT_S = 5.0
MIN_CLIENT_CHECK_S = 5.0
_CREATED_SUBTREES = ("zk", "pg", "nodes")


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
    """The PostgreSQL server as ``status`` sees it; ``pid`` is None when it is not running."""

    pid: int | None
    port: int
    running: bool
    superuser: str
    os_user: str
    data_dir: Path
    log: Path


@dataclass(frozen=True)
class ClusterInfo:
    """What ``up`` and ``status`` report; :meth:`to_json` has DESIGN §10's keys."""

    state_dir: Path
    zk_hosts: str
    database_url: str
    zk_servers: tuple[ZkServerInfo, ...]
    postgres: PostgresInfo
    nodes: tuple[dict[str, Any], ...]
    tick_ms: int

    @property
    def running(self) -> bool:
        """True if every server is running."""
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
            "postgres": {
                "pid": self.postgres.pid,
                "port": self.postgres.port,
                "running": self.postgres.running,
                "superuser": self.postgres.superuser,
                "os_user": self.postgres.os_user,
                "data_dir": str(self.postgres.data_dir),
                "log": str(self.postgres.log),
            },
            "nodes": [dict(node) for node in self.nodes],
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


@dataclass
class _PgRecord:
    port: int
    data_dir: str
    proc: _Proc


@dataclass
class _State:
    tick_ms: int
    superuser: str
    os_user: str
    zk: list[_ZkRecord]
    postgres: _PgRecord
    nodes: list[dict[str, Any]]
    created_at: str
    manager_pid: int

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "created_at": self.created_at,
            "manager_pid": self.manager_pid,
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
            "postgres": {
                "port": self.postgres.port,
                "data_dir": self.postgres.data_dir,
                "pid": self.postgres.proc.pid,
                "argv": self.postgres.proc.argv,
            },
            "nodes": self.nodes,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> _State:
        if raw.get("version") != STATE_VERSION:
            raise ValueError(f"unknown record version {raw.get('version')!r}")
        pg = raw["postgres"]
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
            postgres=_PgRecord(
                int(pg["port"]), str(pg["data_dir"]), _Proc(pg["pid"], [str(a) for a in pg["argv"]])
            ),
            nodes=list(raw.get("nodes", [])),
            created_at=str(raw.get("created_at", "")),
            manager_pid=int(raw.get("manager_pid", 0)),
        )


class LocalCluster:
    """Manager of one embedded cluster in ``state_dir``; see the module rules.

    ``zk_servers`` and ``tick_ms`` apply when the cluster is created (None: the recorded
    values, or 3 servers and 200 ms for a new one). ``pg_port``/``zk_client_ports`` request
    specific ports for a new cluster instead of free ones. ``zk_java_dir`` (or
    ``$ALLOCATOR_ZK_JAVA_DIR``) is where the ZooKeeper jars are; ``pg_bin_dir`` (or
    ``$ALLOCATOR_PG_BIN_DIR``) the PostgreSQL binaries; ``zk_jvm_options`` are added to the
    java command line.
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

    # -- public API -------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        """``<state>/cluster.json``."""
        return self.state_dir / STATE_FILE

    def exists(self) -> bool:
        """True if a cluster is recorded in the state folder."""
        return self.state_file.is_file()

    def up(self, migrate: bool = True) -> ClusterInfo:
        """Start whatever is not running, wait until it serves, apply migrations."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self._locked():
            state = self._load()
            if state is None:
                state = self._new_state()
            else:
                self._check_request(state)
            self._start_missing(state)
            info = self._info(state)
        if migrate:
            _apply_migrations(info.database_url)
        return info

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
                pid_path=zookeeper.pid_path(self.state_dir, server_id),
            )
            record.proc.pid = None
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
                self._rollback(state, zk_ids=[server_id], pg=False)
                raise

    def stop_postgres(self, mode: StopMode = "fast") -> None:
        """Stop PostgreSQL: ``fast`` (SIGINT), ``immediate`` (SIGQUIT) or ``smart`` (SIGTERM)."""
        if mode not in postgres.STOP_MODES:
            raise UsageError(
                f"unknown stop mode {mode!r} (one of {', '.join(postgres.STOP_MODES)})"
            )
        with self._locked():
            state = self._require_state()
            postgres.stop(state.postgres.proc.pid, state.postgres.proc.argv, self.state_dir, mode)
            state.postgres.proc.pid = None
            self._save(state)

    def start_postgres(self) -> None:
        """Start PostgreSQL on its recorded port (no-op if it runs) and wait until it serves."""
        with self._locked():
            state = self._require_state()
            if state.postgres.proc.alive():
                return
            bin_dir, user = self._pg_prerequisites(state)
            ports.ensure_free(state.postgres.port, "PostgreSQL port")
            deadline = time.monotonic() + self._start_timeout_s
            try:
                daemon = self._spawn_pg(state, bin_dir, user)
                self._wait_pg(state, daemon, deadline)
            except BaseException:
                self._rollback(state, zk_ids=[], pg=True)
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
            ports.ensure_free(port, what)
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
            nodes=[],
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            manager_pid=os.getpid(),
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

    def _start_missing(self, state: _State) -> None:
        zk_todo = [r for r in state.zk if not r.proc.alive()]
        pg_todo = not state.postgres.proc.alive()
        if not zk_todo and not pg_todo:
            return
        # Everything that can fail without side effects comes first.
        runtime = self._zk_runtime() if zk_todo else None
        pg_needs = self._pg_prerequisites(state) if pg_todo else None
        for record in zk_todo:
            _check_zk_ports(record)
        if pg_todo:
            ports.ensure_free(state.postgres.port, "PostgreSQL port")
        state.manager_pid = os.getpid()
        self._save(state)
        deadline = time.monotonic() + self._start_timeout_s
        started_zk: list[int] = []
        pg_started = False
        pg_daemon: processes.Daemon | None = None
        try:
            daemons: list[tuple[_ZkRecord, processes.Daemon]] = []
            for record in zk_todo:
                assert runtime is not None
                daemons.append((record, self._spawn_zk(state, record, runtime)))
                started_zk.append(record.server.id)
            if pg_needs is not None:
                # initdb and the PostgreSQL start overlap the ZooKeeper election.
                pg_started = True
                pg_daemon = self._spawn_pg(state, *pg_needs)
            for record, daemon in daemons:
                zookeeper.wait_ready(daemon, record.server, deadline, need_quorum=True)
            if pg_daemon is not None:
                self._wait_pg(state, pg_daemon, deadline)
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
        log.info("zookeeper_started id=%d pid=%d", record.server.id, daemon.pid)
        return daemon

    def _spawn_pg(self, state: _State, bin_dir: Path, user: processes.OsUser) -> processes.Daemon:
        data_dir = postgres.prepare_data_dir(self.state_dir, user)
        if str(data_dir) != state.postgres.data_dir:
            state.postgres.data_dir = str(data_dir)
            self._save(state)
        if not postgres.is_initialized(data_dir):
            postgres.initdb(bin_dir, self.state_dir, data_dir, user, state.superuser)
        daemon = postgres.start(bin_dir, self.state_dir, data_dir, state.postgres.port, user)
        state.postgres.proc = _Proc(daemon.pid, list(daemon.argv))
        self._save(state)
        log.info("postgres_started pid=%d port=%d", daemon.pid, state.postgres.port)
        return daemon

    def _wait_pg(self, state: _State, daemon: processes.Daemon, deadline: float) -> None:
        postgres.wait_ready(daemon, state.postgres.port, state.superuser, deadline)
        postgres.ensure_database(state.postgres.port, state.superuser)

    def _rollback(self, state: _State, *, zk_ids: Sequence[int], pg: bool) -> None:
        """Stop what a failed start began (best effort; the original error is what matters)."""
        try:
            if pg:
                proc = state.postgres.proc
                processes.stop(
                    proc.pid,
                    proc.argv,
                    sig=postgres.stop_signal("immediate"),
                    timeout_s=ROLLBACK_STOP_TIMEOUT_S,
                    pid_path=postgres.pid_path(self.state_dir),
                )
                proc.pid = None
            records = [r for r in state.zk if r.server.id in zk_ids]
            processes.stop_all(
                [(r.proc.pid, r.proc.argv) for r in records if r.proc.pid is not None],
                timeout_s=ROLLBACK_STOP_TIMEOUT_S,
            )
            for record in records:
                record.proc.pid = None
                processes.remove_pid_file(zookeeper.pid_path(self.state_dir, record.server.id))
            self._save(state)
        except Exception:
            log.exception("rollback_failed state=%s", self.state_dir)

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

    # -- stopping ---------------------------------------------------------------------------

    def _stop_everything(self, state: _State) -> None:
        failures: list[str] = []
        first: Exception | None = None

        def attempt(what: str, action: Callable[[], object]) -> None:
            nonlocal first
            try:
                action()
            except Exception as exc:
                log.exception("stop_failed what=%s", what)
                failures.append(f"{what}: {exc}")
                first = first or exc

        node_targets = [
            (int(n["pid"]), [str(a) for a in n.get("argv", [])])
            for n in state.nodes
            if n.get("pid")
        ]
        attempt("nodes", lambda: processes.stop_all(node_targets, timeout_s=NODE_STOP_TIMEOUT_S))
        for node in state.nodes:
            node["pid"] = None
        pg = state.postgres.proc
        attempt("PostgreSQL", lambda: postgres.stop(pg.pid, pg.argv, self.state_dir, "fast"))
        pg.pid = None
        zk_targets = [(r.proc.pid, r.proc.argv) for r in state.zk if r.proc.pid is not None]
        attempt("ZooKeeper", lambda: processes.stop_all(zk_targets, timeout_s=ZK_STOP_TIMEOUT_S))
        for record in state.zk:
            record.proc.pid = None
            processes.remove_pid_file(zookeeper.pid_path(self.state_dir, record.server.id))
        self._save(state)
        if failures:
            raise LocalClusterError("could not stop " + "; ".join(failures)) from first

    def _purge(self, state: _State) -> None:
        relocated = postgres.relocated_data_dir(self.state_dir)
        if relocated is not None:
            shutil.rmtree(relocated, ignore_errors=True)
        for name in _CREATED_SUBTREES:
            shutil.rmtree(self.state_dir / name, ignore_errors=True)
        for name in (STATE_FILE, LOCK_FILE):
            with contextlib.suppress(FileNotFoundError):
                (self.state_dir / name).unlink()
        with contextlib.suppress(OSError):
            self.state_dir.rmdir()  # only if nothing else is in it
        log.info("cluster_purged state=%s zk_servers=%d", self.state_dir, len(state.zk))

    # -- the record -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        path = self.state_dir / LOCK_FILE
        with path.open("a") as handle:
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
        except FileNotFoundError:
            return None
        try:
            return _State.from_json(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            raise LocalClusterError(
                f"{self.state_file} is not a valid cluster record ({exc}); stop the processes "
                "it lists by their pids, then remove it"
            ) from exc

    def _require_state(self) -> _State:
        state = self._load()
        if state is None:
            raise LocalClusterError(
                f"no local cluster in {self.state_dir}: start one with "
                f"`allocator local up --state-dir {self.state_dir}`"
            )
        return state

    def _save(self, state: _State) -> None:
        tmp = self.state_file.with_name(STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
        tmp.replace(self.state_file)

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
        pg_running = state.postgres.proc.alive()
        return ClusterInfo(
            state_dir=self.state_dir,
            zk_hosts=_zk_hosts(state),
            database_url=postgres.database_url(state.superuser, state.postgres.port),
            zk_servers=tuple(servers),
            postgres=PostgresInfo(
                pid=state.postgres.proc.pid if pg_running else None,
                port=state.postgres.port,
                running=pg_running,
                superuser=state.superuser,
                os_user=state.os_user,
                data_dir=Path(state.postgres.data_dir),
                log=postgres.log_path(self.state_dir),
            ),
            nodes=tuple(dict(n) for n in state.nodes),
            tick_ms=state.tick_ms,
        )


def _zk_hosts(state: _State) -> str:
    return ",".join(f"{LOOPBACK}:{r.server.client_port}" for r in state.zk)


def _zk_record(state: _State, server_id: int) -> _ZkRecord:
    for record in state.zk:
        if record.server.id == server_id:
            return record
    ids = ", ".join(str(r.server.id) for r in state.zk)
    raise UsageError(f"no ZooKeeper server {server_id} in this cluster (servers: {ids})")


def _check_zk_ports(record: _ZkRecord) -> None:
    server = record.server
    ports.ensure_free(server.client_port, f"ZooKeeper server {server.id} client port")
    ports.ensure_free(server.peer_port, f"ZooKeeper server {server.id} peer port")
    ports.ensure_free(server.election_port, f"ZooKeeper server {server.id} election port")


def _pick_ports(count: int, exclude: set[int]) -> list[int]:
    """``count`` distinct free ports, none of them in ``exclude``."""
    picked = [p for p in ports.pick_free_ports(count + len(exclude)) if p not in exclude]
    return picked[:count]


def _apply_migrations(database_url: str) -> None:
    """``allocator.migrate.upgrade_to_head``; imported here so status/down skip Alembic."""
    from allocator import migrate

    migrate.upgrade_to_head(database_url)

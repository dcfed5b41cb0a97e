"""What every chaos scenario uses: a cluster of its own, consumers, the leader, waits, the check.

Rules:

- One :class:`ChaosCluster` per scenario: its own ZooKeeper ensemble, PostgreSQL server and
  nodes under the embedded cluster's supervisor, in its own state folder
  ``/tmp/allocator-test-chaos-*`` (mode 0755, so the PostgreSQL user can traverse it).
  Leaving the ``with`` block always stops, by pid, the extra node processes the scenario
  started itself, then runs ``down(purge=True)``, and fails if any process of the cluster
  is still alive. The folder holds an ``owner.pid``: if this session dies without its
  teardown, the next session that starts the shared test servers reaps it
  (``tests/fixtures/cluster.py``); the harness never touches a cluster it did not start.
- Consumers are the product's recorder (:class:`allocator.drill.consumers.Consumers`, the one the
  demo and the drill use): threads in the test process that claim through the consumer URL
  (``allocator_app``, may only claim) with ``allocator.claim_blocks``, record every block
  that *returned* to them, count pool-empty answers (AL003) and other errors by kind,
  reconnect after any error and never stop on one. :func:`chaos_consumers` builds them with
  the suite's names and bounds: every loop is bounded (a claim budget and a deadline), and
  each claim is paced (a rate, not a wait for state).
- The verdict is the product's checker (:mod:`allocator.core.verify`) over the evidence
  :mod:`allocator.postgres.ledger` reads: :meth:`ChaosCluster.check`,
  :meth:`ChaosCluster.assert_clean`.
- Faults go through real mechanisms only: the cluster manager's signals, ZooKeeper and
  PostgreSQL stops, a TCP proxy (:mod:`allocator.drill.proxy`), nodes built in ``tests/``
  through the node's seams (:data:`UNSAFE_NODE_COMMAND`), libfaketime, and the session a
  node records in its session file (:meth:`ChaosCluster.session`, to expire it).
- Nothing sleeps to let things settle: :func:`wait_for` polls an observable condition
  (the fence, the ledger, a node's state or exit code, a metric) until a deadline.
- Observations of the database are made as superuser (``database_url``), on a fresh short
  connection each time, so a PostgreSQL restart never leaves the harness with a dead one.
- All traffic stays on 127.0.0.1.
- When a scenario fails, the tail of every node log is printed (pytest shows it);
  ``ALLOCATOR_CHAOS_SHOW_LOGS=1`` prints them after passing scenarios too (``-rP``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import psycopg

from allocator.config import load_config
from allocator.core.layout import Layout
from allocator.core.verify import Claim, LedgerRow, TermRow, Violation, WriteRow, summary
from allocator.drill.consumers import Consumers
from allocator.drill.node_process import NodeProcess
from allocator.local import nodes as nodes_mod
from allocator.local.cluster import LocalCluster
from allocator.local.info import ClusterInfo, NodeInfo
from allocator.local.processes import is_pid_alive, tail
from allocator.local.tcp_ports import LOOPBACK, pick_free_ports
from allocator.postgres import ledger as verify_db
from allocator.postgres.store import DEFAULT_MAX_CLOCK_AHEAD_MS
from allocator.session import file as session_file
from allocator.session.file import SessionRecord
from tests.fixtures.cluster import OWNER_FILE, STATE_PREFIX, cluster_pids

T = TypeVar("T")

UNSAFE_NODE_COMMAND = (sys.executable, "-m", "tests.chaos.unsafe_node")
"""A node without a fence, built in tests/ through the node's seams (checker proof only)."""

SESSION_TIMEOUT_MS = 2000
SESSION_TIMEOUT_S = SESSION_TIMEOUT_MS / 1000
TICK_MS = 200
WAIT_S = 30.0
"""Default deadline of a wait: generous, a wait normally ends in a few seconds."""
POLL_S = 0.05
DB_CONNECT_TIMEOUT_S = 3
LOG_TAIL_LINES = 40
SHOW_LOGS_ENV = "ALLOCATOR_CHAOS_SHOW_LOGS"
"""Set to 1 to print the nodes' logs after every scenario, not only failed ones (-rP)."""

# The nodes' settings in every scenario (a scenario may add or override). Fast refills and
# reconnects so faults and recoveries show within seconds; a pool that outlasts a ZooKeeper
# outage of several seconds at the consumers' rate. Retention keeps its default (a day), so
# nothing is pruned during a run: the checker's I4 needs every claimed block in the ledger.
NODE_ENV: Mapping[str, str] = {
    "ALLOCATOR_POOL_MIN_BLOCKS": "300",
    "ALLOCATOR_POOL_MAX_BLOCKS": "3000",
    "ALLOCATOR_POOL_RUNWAY_S": "10",
    "ALLOCATOR_POOL_LOW_WATERMARK_BLOCKS": "150",
    "ALLOCATOR_POOL_REFILL_INTERVAL_S": "0.2",
    "ALLOCATOR_POOL_SAMPLE_INTERVAL_S": "0.5",
    "ALLOCATOR_ZOOKEEPER_MAX_RECONNECT_DELAY_S": "0.5",
    "ALLOCATOR_ZOOKEEPER_CONNECT_TIMEOUT_S": "3",
    "ALLOCATOR_POSTGRES_CONNECT_TIMEOUT_S": "2",
    "ALLOCATOR_NODE_SHUTDOWN_TIMEOUT_S": "5",
}

EXTRA_NODE_ZK_CONNECT_TIMEOUT_S = "15"
"""An extra node's first ZooKeeper connect. A supervised node that gives up after NODE_ENV's
3 s is restarted; nobody restarts an extra node, and a loaded machine can stall the server's
createSession (an fsync) past 3 s: CI #25 lost the skewed node of test_clock_skew that way."""

AL003_POOL_EMPTY = "AL003"


def wait_for(
    condition: Callable[[], T | None],
    what: str,
    timeout_s: float = WAIT_S,
    *,
    ignore: tuple[type[Exception], ...] = (psycopg.OperationalError,),
) -> T:
    """Poll ``condition`` until it returns a truthy value, which is returned; fail at the
    deadline. Exceptions in ``ignore`` (default: the database is unreachable) count as
    "not yet"."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = condition()
        except ignore:
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(POLL_S)


def eventually(condition: Callable[[], object], timeout_s: float) -> bool:
    """Poll ``condition`` until it is truthy (True) or the deadline passes (False): for a
    scenario that must clean up before it asserts."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def now_utc() -> datetime:
    return datetime.now(UTC)


def layout() -> Layout:
    """The layout every node of a chaos cluster uses (the defaults)."""
    return load_config(None, {}, env={}).layout


# -- consumers --------------------------------------------------------------------------------

CONSUMER_NAMES: Mapping[str, int] = {"chaos-c1": 1, "chaos-c2": 3}
"""The suite's consumers and the blocks each asks for per call."""
CLAIM_BUDGET = 20_000
"""Calls per consumer at most."""
CLAIM_DEADLINE_S = 240.0
"""Seconds a consumer claims at most."""


def chaos_consumers(
    url: str,
    names: Mapping[str, int] | None = None,
    *,
    pause_s: float = 0.02,
    options: Mapping[str, str] | None = None,
) -> Consumers:
    """The product's recorder with the suite's names and bounds (not started)."""
    return Consumers(
        url,
        names or CONSUMER_NAMES,
        pause_s=pause_s,
        max_calls=CLAIM_BUDGET,
        deadline_s=CLAIM_DEADLINE_S,
        options=options,
    )


# -- node processes a scenario runs itself ---------------------------------------------------


class ExtraNode(NodeProcess):
    """An ``allocator run`` process outside the supervisor, with an environment of its own
    (the supervisor gives every node the same): for a node built in ``tests/`` or a proxied
    ZooKeeper. Nobody restarts it; :meth:`stop` (always called by the cluster) ends it."""

    def __init__(
        self,
        name: str,
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path,
        command: Sequence[str] | None = None,
    ) -> None:
        super().__init__(name, command or nodes_mod.default_command(), env, log_path, cwd)

    def signal(self, sig: signal.Signals) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(sig)


# -- the cluster ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Leader:
    """Who holds the fence, as PostgreSQL says, and its process if we know it."""

    epoch: int
    name: str
    pid: int | None


class ChaosCluster:
    """One scenario's embedded cluster; ``with ChaosCluster(...) as chaos:``. See the rules.

    ``migrate=False`` leaves the database without the schema (and so without the login
    roles): the scenario migrates it itself, then :meth:`up` creates the roles."""

    def __init__(
        self,
        *,
        zk: int = 1,
        nodes: int = 3,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
        node_env: Mapping[str, str] | None = None,
        pg_standby: bool = False,
        migrate: bool = True,
    ) -> None:
        self._zk = zk
        self._migrate = migrate
        self._pg_standby = pg_standby
        self._nodes = nodes
        self.session_timeout_ms = session_timeout_ms
        self._node_env = {**NODE_ENV, **(node_env or {})}
        self._extras: list[ExtraNode] = []
        self.state_dir = Path()
        self.manager: LocalCluster | None = None
        self._pids: list[int] = []
        self.database_url = ""
        """Superuser URL (stable for the cluster's life: its port is recorded)."""

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> ChaosCluster:
        tmp = Path(tempfile.gettempdir())
        self.state_dir = Path(tempfile.mkdtemp(prefix=f"{STATE_PREFIX}chaos-", dir=tmp))
        self.state_dir.chmod(0o755)
        (self.state_dir / OWNER_FILE).write_text(str(os.getpid()))
        self.manager = LocalCluster(
            self.state_dir,
            self._zk,
            tick_ms=TICK_MS,
            session_timeout_ms=self.session_timeout_ms,
            node_env=self._node_env,
            pg_standby=self._pg_standby,
        )
        try:
            self._remember(self.manager.up(migrate=self._migrate, nodes=self._nodes))
        except BaseException:
            self._teardown(failed=True)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._teardown(failed=exc_type is not None)

    def _teardown(self, *, failed: bool) -> None:
        if failed or os.environ.get(SHOW_LOGS_ENV) == "1":
            self.print_logs()
        try:
            for extra in self._extras:
                extra.stop()
            if self.manager is not None:
                with contextlib.suppress(Exception):
                    self._remember(self.manager.status())
                self.manager.down(purge=True)
        finally:
            left = [pid for pid in self._pids if is_pid_alive(pid)]
            left += [e.pid for e in self._extras if e.exit_code is None]
            if not left:
                shutil.rmtree(self.state_dir, ignore_errors=True)
        assert not left, f"processes left behind by the chaos cluster {self.state_dir}: {left}"

    def _remember(self, info: ClusterInfo) -> None:
        self._pids = sorted({*self._pids, *cluster_pids(info)})
        self.database_url = info.database_url

    def print_logs(self) -> None:
        """The tail of every node's log (shown by pytest when a scenario fails)."""
        for path in sorted((self.state_dir / nodes_mod.NODES_DIR).glob("*.log")):
            print(f"----- {path.name} (last {LOG_TAIL_LINES} lines)")
            print(tail(path, LOG_TAIL_LINES))

    # -- the cluster as the manager sees it -------------------------------------------------

    @property
    def cluster(self) -> LocalCluster:
        assert self.manager is not None, "use ChaosCluster in a with block"
        return self.manager

    def info(self) -> ClusterInfo:
        info = self.cluster.status()
        self._remember(info)
        return info

    def node(self, name: str) -> NodeInfo:
        return next(n for n in self.info().nodes if n.name == name)

    def up(self, nodes: int) -> ClusterInfo:
        """Bring the supervised nodes to ``nodes`` (e.g. after extra nodes took the lead)."""
        info = self.cluster.up(migrate=False, nodes=nodes)
        self._remember(info)
        return info

    def node_state_dir(self, name: str) -> Path:
        """The ``node.state_dir`` of node ``name`` (supervised or extra)."""
        return nodes_mod.node_state_dir(self.state_dir, name)

    def session(self, name: str) -> SessionRecord:
        """The ZooKeeper session node ``name`` recorded in its session file (it must have one:
        a running node with a state folder always has)."""
        record = session_file.read(self.node_state_dir(name))
        assert record is not None, f"{name} has no session file in {self.node_state_dir(name)}"
        return record

    # -- extra nodes ------------------------------------------------------------------------

    def start_extra_node(
        self,
        name: str,
        env: Mapping[str, str] | None = None,
        *,
        zk_hosts: str | None = None,
        database_url: str | None = None,
        command: Sequence[str] | None = None,
    ) -> ExtraNode:
        """An ``allocator run`` of our own, named ``name``, configured like the supervised
        nodes (same ZooKeeper chroot, node login role) plus ``env``; ``zk_hosts`` and
        ``database_url`` replace the cluster's (a proxy; the superuser); ``command`` replaces
        ``allocator run`` (a node built in ``tests/``, see :data:`UNSAFE_NODE_COMMAND`)."""
        info = self.info()
        port = pick_free_ports(1)[0]
        node_env = nodes_mod.node_env(
            name=name,
            zk_hosts=zk_hosts or info.node_zk_hosts,
            postgres_url=database_url or info.node_database_url,
            admin_port=port,
            admin_token=info.admin_token,
            zk_auth=info.zk_auth,
            session_timeout_ms=self.session_timeout_ms,
            state_dir=self.node_state_dir(name),
            extra={
                **self._node_env,
                "ALLOCATOR_ZOOKEEPER_CONNECT_TIMEOUT_S": EXTRA_NODE_ZK_CONNECT_TIMEOUT_S,
                **(env or {}),
            },
        )
        log_path = nodes_mod.log_path(self.state_dir, name)
        extra = ExtraNode(name, node_env, log_path, self.state_dir, command)
        self._extras.append(extra)
        return extra

    # -- observations (superuser, a short connection each) ------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self.database_url, autocommit=True, connect_timeout=DB_CONNECT_TIMEOUT_S
        )

    def fence(self) -> tuple[int, str | None]:
        with self._connect() as conn:
            row = conn.execute("SELECT epoch, holder FROM allocator.fence").fetchone()
        assert row is not None
        return int(row[0]), row[1]

    def schema_revision(self) -> str | None:
        """The schema's Alembic revision (None: no schema yet)."""
        with self._connect() as conn:
            if conn.execute("SELECT to_regclass('public.alembic_version')").fetchone() == (None,):
                return None
            row = conn.execute("SELECT version_num FROM public.alembic_version").fetchone()
        return None if row is None else str(row[0])

    def available_blocks(self) -> int:
        with self._connect() as conn:
            row = conn.execute("SELECT available_blocks FROM allocator.pool_status").fetchone()
        return int(row[0]) if row else 0

    def ledger(self) -> list[LedgerRow]:
        with self._connect() as conn:
            return verify_db.read_ledger(conn)

    def history(self) -> list[TermRow]:
        with self._connect() as conn:
            return verify_db.read_history(conn)

    def writes(self) -> list[WriteRow]:
        """The fenced requeues and prunes that changed something, in write order."""
        with self._connect() as conn:
            return verify_db.read_writes(conn)

    def blocks_cut(self, *, epoch: int | None = None, after: datetime | None = None) -> int:
        """Blocks in the ledger (of ``epoch``, cut after ``after``)."""
        query = "SELECT count(*) FROM allocator.blocks WHERE true"
        params: list[object] = []
        if epoch is not None:
            query += " AND epoch = %s"
            params.append(epoch)
        if after is not None:
            query += " AND cut_at > %s"
            params.append(after)
        with self._connect() as conn:
            row = conn.execute(query, params).fetchone()
        return int(row[0]) if row else 0

    def leader(self) -> Leader | None:
        """The fence holder and its pid (supervised or extra node); None before any."""
        epoch, holder = self.fence()
        if holder is None:
            return None
        pid = next((n.pid for n in self.info().nodes if n.name == holder), None)
        pid = pid or next((e.pid for e in self._extras if e.name == holder), None)
        return Leader(epoch, holder, pid)

    def wait_leader(self, *, newer_than: int = 0, timeout_s: float = WAIT_S) -> Leader:
        """The fence holder once its epoch is above ``newer_than``."""

        def newer() -> Leader | None:
            leader = self.leader()
            return leader if leader is not None and leader.epoch > newer_than else None

        return wait_for(newer, f"a leader with an epoch above {newer_than}", timeout_s)

    def wait_cutting(self, epoch: int, after: datetime, timeout_s: float = WAIT_S) -> int:
        """Wait until epoch ``epoch`` has cut a block after ``after``; how many it has."""
        return wait_for(
            lambda: self.blocks_cut(epoch=epoch, after=after),
            f"epoch {epoch} to cut blocks after {after.isoformat()}",
            timeout_s,
        )

    def wait_pool(self, blocks: int, timeout_s: float = WAIT_S) -> int:

        def enough() -> int | None:
            available = self.available_blocks()
            return available if available >= blocks else None

        return wait_for(enough, f"at least {blocks} blocks in the pool", timeout_s)

    def wait_exit(self, name: str, *, restarts_above: int, timeout_s: float = WAIT_S) -> NodeInfo:
        """A supervised node once it has exited and been restarted (restarts > the given)."""

        def restarted() -> NodeInfo | None:
            node = self.node(name)
            return node if node.restarts > restarts_above else None

        return wait_for(restarted, f"{name} to exit and be restarted by the supervisor", timeout_s)

    def wait_role(self, admin_url: str, role: str, what: str) -> None:
        """Until the node at ``admin_url`` reports ``role`` (``leader``, ``follower``); fails at
        once, with its exit code, if that node is an extra node whose process has ended."""
        extra = next((e for e in self._extras if e.admin_url == admin_url), None)

        def has_role() -> bool:
            if extra is not None and extra.exit_code is not None:
                raise AssertionError(f"{what}: {extra.name} exited {extra.exit_code}")
            return bool(http_json(f"{admin_url}/status")["role"] == role)

        wait_for(has_role, what, ignore=(OSError,))

    # -- the verdict ---------------------------------------------------------------------------

    def check(self, records: Sequence[Claim], *, initial_lead_ms: int = 0) -> list[Violation]:
        """The checker over this run: the consumers' records, the ledger, the history, the
        fenced writes and the recorded layout; the clock bound as the nodes are configured."""
        max_ahead_ms = int(
            self._node_env.get("ALLOCATOR_POOL_MAX_CLOCK_AHEAD_MS", DEFAULT_MAX_CLOCK_AHEAD_MS)
        )
        with self._connect() as conn:
            evidence = verify_db.read(conn)
        return verify_db.judge(
            records,
            evidence,
            layout=layout(),
            max_clock_ahead_ms=max_ahead_ms,
            initial_lead_ms=initial_lead_ms,
        )

    def assert_clean(self, consumers: Consumers) -> list[Claim]:
        """Stop the consumers, then assert the checker finds nothing; returns the records."""
        records = consumers.stop()
        assert records, f"the consumers claimed nothing ({consumers.describe()})"
        violations = self.check(records)
        assert not violations, summary(violations)
        return records


# -- a node's admin HTTP ----------------------------------------------------------------------


def http_json(url: str, timeout_s: float = 2.0) -> dict[str, Any]:
    assert url.startswith(f"http://{LOOPBACK}:"), url
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (loopback)
        data: dict[str, Any] = json.loads(response.read())
    return data


def metric(admin_url: str, name: str, timeout_s: float = 2.0) -> float | None:
    """One unlabelled sample of a node's ``/metrics``; None if absent."""
    assert admin_url.startswith(f"http://{LOOPBACK}:"), admin_url
    with urllib.request.urlopen(f"{admin_url}/metrics", timeout=timeout_s) as response:  # noqa: S310
        text = response.read().decode()
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return float(value)
    return None


def log_events(path: Path, event: str) -> list[str]:
    """The lines of a node log carrying ``event=<event>`` (text) or that event (JSON)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    return [line for line in lines if f"event={event} " in f"{line} " or _json_event(line) == event]


def _json_event(line: str) -> object:
    if not line.startswith("{"):
        return None
    try:
        return json.loads(line).get("event")
    except ValueError:
        return None

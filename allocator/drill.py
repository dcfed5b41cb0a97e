"""Handover drills on the embedded cluster: how long leadership takes to move, and proof that
nothing broke meanwhile (``allocator drill``; DESIGN §9, §10).

Rules:

- One cluster manager (:class:`~allocator.local.cluster.LocalCluster`); the drill never
  starts or signals a process any other way. Faults: ``sigkill`` (SIGKILL to the leader:
  its znode lives until its ZooKeeper session expires), ``graceful`` (SIGTERM: the leader
  deletes its znode at once) and ``step-down`` (POST /step-down with the cluster's admin
  token). After SIGKILL or SIGTERM the supervisor restarts the node.
- A round starts only when the cluster is *ready*: every node runs (pid from the
  supervisor's records, ``nodes/nodes.json``), the election holds exactly one znode per node
  with that pid, PostgreSQL's fence is held by the first of them with that pid, and the pool
  is not empty (that leader serves: faults hit a leader at work, not one still taking
  over). That node is the leader the fault hits.
- Handover time = from just before the fault is sent to the first poll that sees the fence
  (``allocator.fence``, read on a dedicated connection every ``FENCE_POLL_INTERVAL_S``) hold
  a newer epoch and another holder. Resolution: the poll interval plus one query. A round
  that does not hand over within ``3 x session timeout + 10 s`` (or whose cluster does not
  become ready again within ``READY_TIMEOUT_S + 2 x session timeout``) fails; it counts in
  ``failed_rounds`` and not in the percentiles. After ``MAX_CONSECUTIVE_FAILURES`` failed
  rounds in a row the rest of the scenario is skipped (recorded as failed).
- Percentiles are nearest-rank over the successful rounds (p99 of 20 rounds is the max).
- Consumers: the product's recorder (:mod:`allocator.consumers`), ``CONSUMERS`` threads
  claiming one block every ``CLAIM_INTERVAL_S`` each through the consumer URL (role
  ``allocator_app``) for the whole drill, recording every block that returned.
  ``claim_errors`` counts failed claims other than "pool empty" (SQLSTATE AL003, counted
  apart as ``pool_empty``), ``claim_error_kinds`` the same by SQLSTATE.
- The verdict after each scenario is the one invariant checker (:mod:`allocator.verify`,
  the demo's and the chaos suite's too) over every record the consumers have so far and
  what :mod:`allocator.verify_db` reads on the superuser URL (ledger, leader history,
  fenced writes, the recorded layout; the clock bound is the nodes' default
  ``pool.max_clock_ahead_ms``). Each violation is one entry of ``violations``, named by its
  invariant with a message; a scenario lists only those no earlier scenario of the drill
  reported.
- ``stale_writes_rejected`` counts ``event=fenced_write_rejected`` lines the nodes logged
  during the scenario (their log files, from the byte offset at its start): the nodes'
  ``/metrics`` counters restart from zero with every restarted node, the logs do not.
- Every wait has a deadline; everything the drill opens (connections, the ZooKeeper client,
  threads) is closed by :meth:`Drill.close`. Stopping the cluster is the caller's choice.
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psycopg
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from allocator import consumers as consumers_mod
from allocator import verify_db, zkclient
from allocator.config import ZookeeperConfig
from allocator.consumers import Consumers, ConsumerStats, StuckConsumersError
from allocator.db import DEFAULT_MAX_CLOCK_AHEAD_MS
from allocator.election import Contender, read_contenders
from allocator.errors import AllocatorError, DatabaseError, ZooKeeperUnavailableError
from allocator.layout import Layout
from allocator.local import nodes as nodes_mod
from allocator.local.cluster import ClusterInfo, LocalCluster
from allocator.verify import Violation

log = logging.getLogger(__name__)

SIGKILL = "sigkill"
GRACEFUL = "graceful"
STEP_DOWN = "step-down"
SCENARIOS: Final = (SIGKILL, GRACEFUL, STEP_DOWN)

FENCE_POLL_INTERVAL_S = 0.01
READY_POLL_INTERVAL_S = 0.05
READY_TIMEOUT_S = 30.0
HANDOVER_TIMEOUT_FACTOR = 3
HANDOVER_TIMEOUT_MARGIN_S = 10.0
MAX_CONSECUTIVE_FAILURES = 3
CONSUMERS = 2
CLAIM_INTERVAL_S = 0.02
CONNECT_TIMEOUT_S = 5
ZK_TIMEOUT_S = 15.0
HTTP_TIMEOUT_S = 5.0
FENCED_WRITE_EVENT = b"event=fenced_write_rejected"
ELECTION_PATH = ZookeeperConfig().election_path  # the local nodes use the default

# -- statements (superuser URL: the drill reads the tables the views are built on) ---------

READ_FENCE: Final = "SELECT epoch, holder, pid FROM allocator.fence"
"""The fence row, cheaply (``pool_status`` would also count the pool at every poll)."""

READ_AVAILABLE_BLOCKS: Final = "SELECT available_blocks FROM allocator.pool_status"


class DrillError(AllocatorError):
    """The drill could not run, or found what it must not (violations, failed rounds)."""


# -- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FenceState:
    epoch: int
    holder: str | None
    pid: int | None


@dataclass(frozen=True)
class Leader:
    """The node the next fault hits: fence holder, first contender, running with ``pid``."""

    name: str
    pid: int
    epoch: int
    admin_url: str


@dataclass
class RoundResult:
    round: int
    leader: str | None = None
    leader_pid: int | None = None
    epoch: int | None = None
    new_leader: str | None = None
    new_epoch: int | None = None
    handover_ms: float | None = None
    ready_ms: float | None = None
    """From the fault until every node was back in the election (the next round may start)."""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.handover_ms is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "ok": self.ok,
            "leader": self.leader,
            "leader_pid": self.leader_pid,
            "epoch": self.epoch,
            "new_leader": self.new_leader,
            "new_epoch": self.new_epoch,
            "handover_ms": self.handover_ms,
            "ready_ms": self.ready_ms,
            "error": self.error,
        }


@dataclass
class ScenarioResult:
    """One scenario; :meth:`to_json` has DESIGN §10's keys and more."""

    scenario: str
    session_timeout_ms: int
    nodes: int
    zk_servers: int
    rounds: list[RoundResult] = field(default_factory=list)
    claims: int = 0
    claim_errors: int = 0
    claim_error_kinds: dict[str, int] = field(default_factory=dict)
    claim_error_examples: list[str] = field(default_factory=list)
    pool_empty: int = 0
    stale_writes_rejected: int = 0
    violations: list[Violation] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def failed_rounds(self) -> int:
        return sum(not r.ok for r in self.rounds)

    def handover_times_ms(self) -> list[float]:
        return [r.handover_ms for r in self.rounds if r.ok and r.handover_ms is not None]

    def handover_summary(self) -> dict[str, float | None]:
        return summarize(self.handover_times_ms())

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "rounds": len(self.rounds),
            "violations": [v.to_json() for v in self.violations],
            "handover_ms": self.handover_summary(),
            "stale_writes_rejected": self.stale_writes_rejected,
            "claim_errors": self.claim_errors,
            "claim_error_kinds": self.claim_error_kinds,
            "failed_rounds": self.failed_rounds,
            "session_timeout_ms": self.session_timeout_ms,
            "nodes": self.nodes,
            "zk_servers": self.zk_servers,
            "claims": self.claims,
            "pool_empty": self.pool_empty,
            "claim_error_examples": self.claim_error_examples,
            "duration_s": round(self.duration_s, 1),
            "round_results": [r.to_json() for r in self.rounds],
        }


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile ``p`` (0 < p <= 100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(values_ms: Sequence[float]) -> dict[str, float | None]:
    """``{"p50", "p90", "p99", "max"}`` in ms, rounded to 0.1 ms; None without values."""

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return {
        "p50": rounded(percentile(values_ms, 50)),
        "p90": rounded(percentile(values_ms, 90)),
        "p99": rounded(percentile(values_ms, 99)),
        "max": rounded(max(values_ms) if values_ms else None),
    }


def handover_timeout_s(session_timeout_ms: int) -> float:
    """How long a round may wait for a new epoch before it counts as failed."""
    return HANDOVER_TIMEOUT_FACTOR * session_timeout_ms / 1000 + HANDOVER_TIMEOUT_MARGIN_S


def ready_timeout_s(session_timeout_ms: int) -> float:
    """How long the drill waits for every node to be back in the election."""
    return READY_TIMEOUT_S + 2 * session_timeout_ms / 1000


# -- reading the cluster ------------------------------------------------------------------


class FenceReader:
    """A dedicated autocommit connection that reads the fence row (no pool, no retries)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.Connection[Any] | None = None

    def read(self) -> FenceState:
        try:
            row = self._connection().execute(READ_FENCE).fetchone()
        except psycopg.OperationalError:
            self.close()  # reconnect at the next read
            raise
        if row is None:
            raise DrillError("the fence row is missing (schema not migrated?)")
        return FenceState(int(row[0]), row[1], row[2])

    def available_blocks(self) -> int:
        """Unclaimed blocks in the pool (``allocator.pool_status``)."""
        row = self._connection().execute(READ_AVAILABLE_BLOCKS).fetchone()
        return 0 if row is None else int(row[0])

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self._url,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name="allocator-drill",
            )
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def running_pids(state_dir: Path, names: Iterable[str]) -> dict[str, int]:
    """Node name → pid of every node in ``names`` that the supervisor's records show alive."""
    runtime = nodes_mod.read_runtime(state_dir)
    found: dict[str, int] = {}
    if runtime is None:
        return found
    for name in names:
        record = runtime.node(name)
        if record is not None and record.pid is not None and record.alive():
            found[name] = record.pid
    return found


def ready_leader(
    fence: FenceState,
    contenders: Sequence[Contender],
    pids: Mapping[str, int],
    names: Sequence[str],
    admin_urls: Mapping[str, str],
) -> tuple[Leader | None, str]:
    """The leader when the cluster is ready for a round (see the module rules), else why not."""
    missing = [n for n in names if n not in pids]
    if missing:
        return None, f"not running: {', '.join(missing)}"
    queued = [(c.identity.name, c.identity.pid) for c in contenders]
    if sorted(queued) != sorted(pids.items()):
        shown = ", ".join(f"{n}/{p}" for n, p in queued) or "none"
        return None, f"election holds {shown}; running: {dict(pids)}"
    first = queued[0][0]
    if fence.holder != first or fence.pid != pids[first]:
        return None, f"fence held by {fence.holder}/{fence.pid}, election led by {first}"
    return Leader(first, pids[first], fence.epoch, admin_urls.get(first, "")), ""


def wait_until(
    check: Callable[[], tuple[Any, str]], timeout_s: float, interval_s: float, what: str
) -> Any:
    """Call ``check`` (→ (result or None, reason)) until it returns a result; bounded."""
    deadline = time.monotonic() + timeout_s
    reason = ""
    while True:
        try:
            result, reason = check()
        except (psycopg.Error, KazooException) as exc:
            result, reason = None, f"{type(exc).__name__}: {exc}"
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise DrillError(f"{what}: not within {timeout_s:.0f} s ({reason})")
        time.sleep(interval_s)


def wait_new_epoch(
    fence: FenceReader, old: Leader, timeout_s: float
) -> tuple[FenceState, float] | None:
    """Poll the fence until a newer epoch held by another node shows; (it, monotonic time)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            state = fence.read()
        except psycopg.Error as exc:
            log.warning("event=fence_read_failed error=%s", exc)
        else:
            seen = time.monotonic()
            if state.epoch > old.epoch and state.holder != old.name:
                return state, seen
        if time.monotonic() >= deadline:
            return None
        time.sleep(FENCE_POLL_INTERVAL_S)


def apply_fault(scenario: str, cluster: LocalCluster, leader: Leader, admin_token: str) -> None:
    """Hit ``leader`` with the scenario's fault (returns as soon as it is sent)."""
    if scenario == SIGKILL:
        cluster.signal_node(leader.name, "SIGKILL")
    elif scenario == GRACEFUL:
        cluster.signal_node(leader.name, "SIGTERM")
    elif scenario == STEP_DOWN:
        request_step_down(leader.admin_url, admin_token)
    else:
        raise DrillError(f"unknown scenario {scenario!r} (one of {', '.join(SCENARIOS)})")


def request_step_down(admin_url: str, token: str) -> None:
    """POST /step-down to one node; raises :class:`DrillError` unless it accepted (202)."""
    if not admin_url.startswith("http://"):
        raise DrillError(f"no admin URL to ask for a step-down ({admin_url!r})")
    request = urllib.request.Request(  # noqa: S310 (scheme checked above)
        f"{admin_url}/step-down", method="POST", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:  # noqa: S310
            code = response.status
    except urllib.error.HTTPError as exc:
        raise DrillError(f"step-down refused by {admin_url}: HTTP {exc.code}") from exc
    except OSError as exc:
        raise DrillError(f"cannot reach {admin_url}") from exc
    if code != 202:
        raise DrillError(f"step-down at {admin_url} answered HTTP {code}, not 202")


class LogCounter:
    """Counts ``event=fenced_write_rejected`` lines appended to the node logs since a mark."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self._paths = list(paths)
        self._offsets: dict[Path, int] = {}

    def mark(self) -> None:
        self._offsets = {path: _size(path) for path in self._paths}

    def count(self) -> int:
        total = 0
        for path in self._paths:
            try:
                with path.open("rb") as handle:
                    handle.seek(self._offsets.get(path, 0))
                    total += sum(line.count(FENCED_WRITE_EVENT) for line in handle)
            except OSError:
                continue
        return total


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# -- the drill ----------------------------------------------------------------------------


Progress = Callable[[str], None]


class Drill:
    """Runs scenarios against a cluster that is up (``info`` from its ``up``).

    Opens a fence connection, a ZooKeeper client and the consumer threads in :meth:`open`;
    :meth:`close` closes them (also after a failed ``open``). Remembers every pid it saw.
    """

    def __init__(
        self,
        cluster: LocalCluster,
        info: ClusterInfo,
        *,
        progress: Progress = lambda _line: None,
    ) -> None:
        self._cluster = cluster
        self._info = info
        self._progress = progress
        self._names = [n.name for n in info.nodes]
        self._admin_urls = {n.name: n.admin_url for n in info.nodes}
        self._timeout_ms = info.session_timeout_ms
        self._fence = FenceReader(info.database_url)
        self._zk: Any = None
        self._consumers = Consumers(
            info.consumer_database_url,
            consumers_mod.named("drill-consumer", CONSUMERS),
            pause_s=CLAIM_INTERVAL_S,
        )
        self._reported: set[Violation] = set()
        self._logs = LogCounter(n.log for n in info.nodes)
        self.pids: set[int] = set(_cluster_pids(info))

    def open(self) -> None:
        logging.getLogger("kazoo").setLevel(logging.ERROR)  # reconnect chatter is noise here
        client = zkclient.client_for(
            self._info.node_zk_hosts, self._info.zk_auth, timeout_s=ZK_TIMEOUT_S
        )
        try:
            client.start(timeout=ZK_TIMEOUT_S)
        except KazooTimeoutError as exc:
            client.close()
            raise ZooKeeperUnavailableError(
                f"no ZooKeeper server answered at {self._info.node_zk_hosts}"
            ) from exc
        self._zk = client
        self.wait_ready()  # a first leader has taken the fence
        self._consumers.start()

    def close(self) -> None:
        try:
            self._consumers.stop()
        except StuckConsumersError as exc:
            log.warning("event=consumers_stuck error=%s", exc)
        if self._zk is not None:
            self._zk.stop()
            self._zk.close()
            self._zk = None
        self._fence.close()

    def run(self, scenario: str, rounds: int) -> ScenarioResult:
        """``rounds`` rounds of ``scenario``, then the checks."""
        if scenario not in SCENARIOS:
            raise DrillError(f"unknown scenario {scenario!r} (one of {', '.join(SCENARIOS)})")
        result = ScenarioResult(
            scenario, self._timeout_ms, len(self._names), len(self._info.zk_servers)
        )
        started = time.monotonic()
        before = self._consumers.totals()
        self._logs.mark()
        failures = 0
        for number in range(1, rounds + 1):
            if failures >= MAX_CONSECUTIVE_FAILURES:
                error = f"skipped after {failures} failed rounds in a row"
                result.rounds.append(RoundResult(number, error=error))
                continue
            outcome = self._round(scenario, number)
            result.rounds.append(outcome)
            failures = 0 if outcome.ok else failures + 1
            self._progress(_round_line(scenario, outcome))
        _record_claims(result, self._consumers.totals().since(before))
        result.stale_writes_rejected = self._logs.count()
        result.violations = self._new_violations()
        result.duration_s = time.monotonic() - started
        return result

    def verdict(self) -> list[Violation]:
        """Every violation of the run so far: the checker over the consumers' records and
        the database's evidence. The records are taken first: a claim that returned before
        the database is read has committed, so the ledger shows it (the consumers run on)."""
        records = self._consumers.records()
        try:
            evidence = verify_db.read_url(self._info.database_url)
        except DatabaseError as exc:
            raise DrillError(f"cannot judge the run: {exc}") from exc
        return verify_db.judge(
            records,
            evidence,
            layout=Layout(),
            max_clock_ahead_ms=DEFAULT_MAX_CLOCK_AHEAD_MS,
        )

    def _new_violations(self) -> list[Violation]:
        found = [v for v in self.verdict() if v not in self._reported]
        self._reported.update(found)
        return found

    def wait_ready(self) -> Leader:
        """Wait (bounded) until every node is in the election and the first holds the fence."""

        def check() -> tuple[Leader | None, str]:
            pids = running_pids(self._cluster.state_dir, self._names)
            self.pids.update(pids.values())
            contenders = read_contenders(self._zk, ELECTION_PATH)
            fence = self._fence.read()
            leader, reason = ready_leader(fence, contenders, pids, self._names, self._admin_urls)
            if leader is not None and self._fence.available_blocks() == 0:
                return None, f"the pool is empty: {leader.name} has not cut yet"
            return leader, reason

        leader: Leader = wait_until(
            check,
            ready_timeout_s(self._timeout_ms),
            READY_POLL_INTERVAL_S,
            "every node in the election and the first holding the fence",
        )
        return leader

    def _round(self, scenario: str, number: int) -> RoundResult:
        outcome = RoundResult(number)
        try:
            leader = self.wait_ready()
        except DrillError as exc:
            outcome.error = str(exc)
            return outcome
        outcome.leader, outcome.leader_pid, outcome.epoch = leader.name, leader.pid, leader.epoch
        fault_at = time.monotonic()
        try:
            apply_fault(scenario, self._cluster, leader, self._info.admin_token)
        except AllocatorError as exc:
            outcome.error = f"fault not applied: {exc}"
            return outcome
        seen = wait_new_epoch(self._fence, leader, handover_timeout_s(self._timeout_ms))
        if seen is None:
            outcome.error = (
                f"no new epoch within {handover_timeout_s(self._timeout_ms):.0f} s "
                f"(fence: {self._fence_text()})"
            )
            return outcome
        state, seen_at = seen
        outcome.new_leader, outcome.new_epoch = state.holder, state.epoch
        outcome.handover_ms = round((seen_at - fault_at) * 1000, 1)
        try:
            self.wait_ready()
        except DrillError as exc:
            outcome.error = f"handed over, but {exc}"
            return outcome
        outcome.ready_ms = round((time.monotonic() - fault_at) * 1000, 1)
        return outcome

    def _fence_text(self) -> str:
        try:
            state = self._fence.read()
        except psycopg.Error as exc:
            return f"unreadable: {exc}"
        return f"epoch {state.epoch} held by {state.holder}"


def _record_claims(result: ScenarioResult, stats: ConsumerStats) -> None:
    result.claims = stats.claims
    result.claim_errors = stats.errors
    result.claim_error_kinds = stats.error_kinds
    result.claim_error_examples = stats.error_examples
    result.pool_empty = stats.pool_empty


def _cluster_pids(info: ClusterInfo) -> list[int]:
    pids = [s.pid for s in info.zk_servers] + [info.postgres.pid, info.supervisor_pid]
    pids += [n.pid for n in info.nodes]
    return [p for p in pids if p is not None]


def _round_line(scenario: str, outcome: RoundResult) -> str:
    if outcome.ok:
        return (
            f"{scenario} round {outcome.round}: {outcome.leader} (epoch {outcome.epoch}) -> "
            f"{outcome.new_leader} (epoch {outcome.new_epoch}) in {outcome.handover_ms:.1f} ms"
        )
    return f"{scenario} round {outcome.round}: FAILED: {outcome.error}"


# -- output -------------------------------------------------------------------------------


TABLE_COLUMNS: Final = (
    ("scenario", 10),
    ("rounds", 6),
    ("failed", 6),
    ("p50 ms", 8),
    ("p90 ms", 8),
    ("p99 ms", 8),
    ("max ms", 8),
    ("session timeout ms", 18),
    ("claims", 7),
    ("claim errors", 12),
    ("stale writes rejected", 21),
    ("violations", 10),
)


def render_table(results: Sequence[ScenarioResult]) -> list[str]:
    """One header line and one line per scenario (the numbers of :meth:`ScenarioResult.to_json`)."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    lines = [
        "  ".join(
            f"{name:>{width}}" if i else f"{name:<{width}}"
            for i, (name, width) in enumerate(TABLE_COLUMNS)
        )
    ]
    for r in results:
        summary = r.handover_summary()
        cells = [
            r.scenario,
            str(len(r.rounds)),
            str(r.failed_rounds),
            ms(summary["p50"]),
            ms(summary["p90"]),
            ms(summary["p99"]),
            ms(summary["max"]),
            str(r.session_timeout_ms),
            str(r.claims),
            str(r.claim_errors),
            str(r.stale_writes_rejected),
            str(len(r.violations)),
        ]
        lines.append(
            "  ".join(
                f"{cell:>{width}}" if i else f"{cell:<{width}}"
                for i, (cell, (_name, width)) in enumerate(zip(cells, TABLE_COLUMNS, strict=True))
            )
        )
    return lines


def render_violations(results: Sequence[ScenarioResult]) -> list[str]:
    """One line per violation, named: ``<scenario>: <invariant>: <message>``."""
    return [f"{r.scenario}: {v}" for r in results for v in r.violations]


def document(
    results: Sequence[ScenarioResult], cluster: Mapping[str, Any], *, single: bool
) -> dict[str, Any]:
    """The JSON document: one scenario's object (``single``), else ``{"scenarios": [...]}``;
    either way with a ``cluster`` key (state folder, every pid the drill saw, what was left)."""
    if single:
        [only] = results
        return {**only.to_json(), "cluster": dict(cluster)}
    return {"scenarios": [r.to_json() for r in results], "cluster": dict(cluster)}


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)

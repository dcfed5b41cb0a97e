"""The drill's runner: rounds of faults against a ready cluster, measured and judged
(docs/design.md §9). Every wait has a deadline; whatever a round injected is healed before it
returns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psycopg
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from allocator.config import ZookeeperConfig
from allocator.core import logs
from allocator.core.errors import AllocatorError, DatabaseError, ZooKeeperUnavailableError
from allocator.core.layout import Layout
from allocator.core.verify import Violation
from allocator.drill import consumers as consumers_mod
from allocator.drill import scenarios as scenarios_mod
from allocator.drill.consumers import Consumers, ConsumerStats, StuckConsumersError
from allocator.drill.observe import (
    FENCE_POLL_INTERVAL_S,
    DrillError,
    FenceReader,
    FenceState,
    Leader,
    LogCounter,
    newer_epoch,
    node_serves,
    ready_leader,
    wait_until,
)
from allocator.drill.results import RoundResult, ScenarioResult
from allocator.drill.scenarios import Fault, Scenario, Target, Waits
from allocator.drill.timeline import Timeline
from allocator.postgres import ledger as verify_db
from allocator.postgres.store import DEFAULT_MAX_CLOCK_AHEAD_MS
from allocator.zookeeper import client as zkclient
from allocator.zookeeper.election import read_contenders

log = logs.get_logger(__name__)

READY_POLL_INTERVAL_S: Final = 0.05
READY_TIMEOUT_S: Final = 30.0
MAX_CONSECUTIVE_FAILURES: Final = 3
CONSUMERS: Final = 2
CLAIM_INTERVAL_S: Final = 0.02
ZK_TIMEOUT_S: Final = 15.0
ELECTION_PATH: Final = ZookeeperConfig().election_path

Progress = Callable[[str], None]
PidSource = Callable[[Sequence[Any]], dict[str, int]]
"""Node name → running pid, given the contenders read (a deployed cluster trusts them)."""


def ready_timeout_s(session_timeout_ms: int) -> float:
    """How long the drill waits for every node to be back in the election."""
    return READY_TIMEOUT_S + 2 * session_timeout_ms / 1000


@dataclass(frozen=True)
class Sources:
    """Where the drill reads and claims: URLs, the ZooKeeper identity, node logs, pids."""

    database_url: str
    consumer_url: str
    zk_auth: str
    pids: PidSource
    node_logs: tuple[Path, ...] = ()
    election_path: str = ELECTION_PATH
    known_pids: tuple[int, ...] = ()
    """Processes of the cluster the drill reports (servers, supervisor), besides nodes."""


class Drill(Waits):
    """Runs scenarios against a cluster that is up.

    Consumers (the product's recorder, :mod:`allocator.drill.consumers`) claim throughout
    through the consumer URL: ``claim_errors`` counts failed claims other than "pool empty"
    (AL003, counted apart as ``pool_empty``), ``claim_error_kinds`` the same by SQLSTATE.
    ``stale_writes_rejected`` counts the ``fenced_write_rejected`` events (text or JSON
    lines) the nodes logged during a scenario (local clusters: their log files); 0 when the
    drill has no logs to read. Stopping the cluster is the caller's choice.
    """

    def __init__(
        self,
        target: Target,
        sources: Sources,
        *,
        progress: Progress = lambda _line: None,
    ) -> None:
        self.target = target
        self._sources = sources
        self._progress = progress
        self._fence = FenceReader(sources.database_url)
        self._zk: KazooClient | None = None
        self._consumers = Consumers(
            sources.consumer_url,
            consumers_mod.named("drill-consumer", CONSUMERS),
            pause_s=CLAIM_INTERVAL_S,
        )
        self.timeline = Timeline(
            sources.database_url, target.admin_urls, lambda: self._consumers.totals().claims
        )
        self._reported: set[Violation] = set()
        self._logs = LogCounter(sources.node_logs) if sources.node_logs else None
        self.pids: set[int] = set(sources.known_pids)
        self._node_pids: dict[str, int] = {}
        """Node name → pid, as the last :meth:`wait_ready` saw them."""
        self._round_pids: dict[str, int] = {}
        """The same, when the round in progress began."""

    # -- lifecycle ----------------------------------------------------------------------------

    def open(self) -> None:
        """Connects to ZooKeeper, waits for a first leader, starts the consumers and the
        timeline; :meth:`close` undoes it, also after a failed ``open``."""
        logging.getLogger("kazoo").setLevel(logging.ERROR)  # reconnect chatter is noise here
        client = zkclient.client_for(
            self.target.zk_hosts, self._sources.zk_auth, timeout_s=ZK_TIMEOUT_S
        )
        try:
            client.start(timeout=ZK_TIMEOUT_S)
        except KazooTimeoutError as exc:
            client.close()
            raise ZooKeeperUnavailableError(
                f"no ZooKeeper server answered at {self.target.zk_hosts}"
            ) from exc
        self._zk = client
        self.wait_ready()  # a first leader has taken the fence
        self._consumers.start()
        self.timeline.start()

    def close(self) -> None:
        """Closes everything :meth:`open` opened (threads, connections, the ZooKeeper client)."""
        self.timeline.stop()
        try:
            self._consumers.stop()
        except StuckConsumersError as exc:
            log.warning("consumers_stuck", error=str(exc))
        if self._zk is not None:
            self._zk.stop()
            self._zk.close()
            self._zk = None
        self._fence.close()

    # -- scenarios ----------------------------------------------------------------------------

    def run(self, scenario: str, rounds: int) -> ScenarioResult:
        """``rounds`` rounds of ``scenario``, then the checks."""
        return self._run(scenario, [(scenario,)] * rounds)

    def run_schedule(
        self, schedule: Sequence[tuple[str, ...]], *, seed: int, until: float | None = None
    ) -> ScenarioResult:
        """A mixed schedule (:func:`allocator.drill.schedule.mixed`), stopping early at the
        monotonic time ``until`` if given (a soak)."""
        result = self._run(scenarios_mod.MIXED, schedule, until=until)
        result.seed = seed
        return result

    def _run(
        self, label: str, schedule: Sequence[tuple[str, ...]], until: float | None = None
    ) -> ScenarioResult:
        """The rounds of ``schedule``, then the verdict.

        Failed rounds count in ``failed_rounds``, not in the percentiles; after
        :data:`MAX_CONSECUTIVE_FAILURES` in a row the rest is skipped (recorded as failed), and
        a soak (``until``) stops there, its schedule being endless. The verdict lists only the
        violations no earlier scenario reported."""
        for names in schedule:
            for name in names:
                if name not in scenarios_mod.SCENARIOS:
                    raise DrillError(f"unknown scenario {name!r}")
        result = ScenarioResult(
            label,
            self.target.session_timeout_ms,
            len(self.target.names),
            len(self.target.zk_server_ids),
        )
        started = time.monotonic()
        from_s = self.timeline.now_s()
        before = self._consumers.totals()
        if self._logs is not None:
            self._logs.mark()
        failures = 0
        for number, names in enumerate(schedule, start=1):
            if until is not None and time.monotonic() >= until:
                break
            if failures >= MAX_CONSECUTIVE_FAILURES:
                if until is not None:  # a soak: the cluster is stuck, the run is over
                    self._progress(f"{label}: stopped after {failures} failed rounds in a row")
                    break
                error = f"skipped after {failures} failed rounds in a row"
                result.rounds.append(RoundResult(number, faults=list(names), error=error))
                continue
            round_before = self._consumers.totals()
            outcome = self._round(names, number)
            during = self._consumers.totals().since(round_before)
            outcome.claims, outcome.claim_errors = during.claims, during.errors
            outcome.pool_empty = during.pool_empty
            result.rounds.append(outcome)
            failures = 0 if outcome.ok else failures + 1
            self._progress(_round_line(label, outcome))
        _record_claims(result, self._consumers.totals().since(before))
        result.stale_writes_rejected = self._logs.count() if self._logs is not None else 0
        result.violations = self._new_violations()
        result.duration_s = time.monotonic() - started
        result.leaderless_s = self.timeline.leaderless_s(from_s, self.timeline.now_s())
        return result

    # -- the verdict --------------------------------------------------------------------------

    def verdict(self) -> list[Violation]:
        """Every violation of the run so far: the checker over the consumers' records and
        the database's evidence. The records are taken first: a claim that returned before
        the database is read has committed, so the ledger shows it (the consumers run on)."""
        records = self._consumers.records()
        try:
            evidence = verify_db.read_url(self._sources.database_url)
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

    # -- waits (also what a blocking inject uses) ---------------------------------------------

    def wait_ready(self) -> Leader:
        """Wait (bounded) until every node is in the election and the first holds the fence."""
        zk = self._zk
        if zk is None:
            raise DrillError("the drill is not open")

        def check() -> tuple[Leader | None, str]:
            contenders = read_contenders(zk, self._sources.election_path)
            pids = self._sources.pids(contenders)
            self.pids.update(pids.values())
            self._node_pids = dict(pids)
            fence = self._fence.read()
            leader, reason = ready_leader(
                fence, contenders, pids, self.target.names, self.target.admin_urls
            )
            if leader is not None:
                cover_s = 2 * self.target.session_s
                at_work, why = self._fence.pool().at_work(leader.epoch, cover_s)
                if not at_work:
                    return None, f"{leader.name}: {why}"
                # The fence and the queue name a leader a moment before its term begins, and
                # after a term it ended while keeping its session and znode (it then queues
                # again): a fault or a step-down aimed at it then would hit no leader (CI #28:
                # step-down refused, HTTP 409). Its own /status says whether it serves; a
                # deployed node whose admin URL the drill does not know is taken as it is.
                if leader.admin_url.startswith("http://") and not node_serves(leader.admin_url):
                    return None, f"{leader.name} holds the fence but does not serve (yet)"
            return leader, reason

        leader: Leader = wait_until(
            check,
            ready_timeout_s(self.target.session_timeout_ms),
            READY_POLL_INTERVAL_S,
            "every node in the election and the first holding the fence",
        )
        return leader

    def wait_newer(self, than: Leader) -> Leader:
        """Until the fence shows a newer epoch than ``than``'s held by another node."""

        def check() -> tuple[Leader | None, str]:
            state = newer_epoch(self._fence, than)
            if state is None or state.holder is None or state.pid is None:
                return None, f"{than.name} still holds epoch {than.epoch} (or no newer holder)"
            url = self.target.admin_urls.get(state.holder, "")
            return Leader(state.holder, state.pid, state.epoch, url), ""

        timeout_s = ready_timeout_s(self.target.session_timeout_ms)
        leader: Leader = wait_until(check, timeout_s, FENCE_POLL_INTERVAL_S, "a newer leader")
        return leader

    def wait_restarted(self, name: str, old_pid: int) -> None:
        """Until node ``name`` runs again with a pid other than ``old_pid``."""

        def check() -> tuple[bool | None, str]:
            pids = self._sources.pids([])
            pid = pids.get(name)
            if pid is not None and pid != old_pid:
                self.pids.add(pid)
                return True, ""
            return None, f"{name} runs as {pid}"

        wait_until(
            check,
            ready_timeout_s(self.target.session_timeout_ms),
            READY_POLL_INTERVAL_S,
            f"{name} to restart",
        )

    # -- one round ----------------------------------------------------------------------------

    def _round(self, names: tuple[str, ...], number: int) -> RoundResult:
        """One round: wait until ready (that leader is the one the faults hit), inject, then
        :meth:`_observe`; whatever was injected is healed before returning, whatever happened.

        A round fails when a fault could not be applied or healed, a required handover did
        not come within the scenario's deadline, or the cluster was not ready again within
        :func:`ready_timeout_s`."""
        outcome = RoundResult(number, faults=list(names))
        try:
            leader = self.wait_ready()
        except DrillError as exc:
            outcome.error = str(exc)
            return outcome
        outcome.leader, outcome.leader_pid, outcome.epoch = leader.name, leader.pid, leader.epoch
        self._round_pids = dict(self._node_pids)
        scenarios = [scenarios_mod.SCENARIOS[name] for name in names]
        faults: list[Fault] = []
        try:
            for scenario in scenarios:
                faults.append(scenario.inject(self.target, leader, self))
        except (AllocatorError, OSError) as exc:
            outcome.error = f"fault not applied: {exc}"
            self._heal_all(faults, outcome)
            return outcome
        except BaseException:  # Ctrl-C or SIGTERM: never leave a node paused or cut off
            self._heal_all(faults, outcome)
            raise
        try:
            return self._observe(scenarios, faults, leader, outcome, number)
        except BaseException:
            self._heal_all(faults, outcome)
            raise

    def _observe(
        self,
        scenarios: Sequence[Scenario],
        faults: list[Fault],
        leader: Leader,
        outcome: RoundResult,
        number: int,
    ) -> RoundResult:
        """The rest of a round once its faults are in: handover, heal, ready again."""
        marks = [self.timeline.fault(f.scenario, number, f.started_at, f.target) for f in faults]
        outcome.target = ", ".join(sorted({f.target for f in faults if f.target}))
        leader = next((f.away_from for f in faults if f.away_from is not None), leader)
        self._watch(scenarios, faults, leader, outcome)
        self._heal_all(faults, outcome)
        if outcome.error is None:
            try:
                ready = self.wait_ready()
            except DrillError as exc:
                outcome.error = f"not ready again: {exc}"
            else:
                outcome.ready_ms = round((time.monotonic() - faults[0].started_at) * 1000, 1)
                if outcome.new_leader is None and ready.epoch > leader.epoch:
                    outcome.new_leader, outcome.new_epoch = ready.name, ready.epoch
                self._measure(faults, outcome, serving=any(s.rides_out for s in scenarios))
                self._note_successor(leader, outcome)
                if len(scenarios) == 1 and outcome.error is None:
                    outcome.error = scenarios[0].judge(outcome)
        for fault, mark in zip(faults, marks, strict=True):
            mark.handover_ms = outcome.handover_ms
            mark.ok = outcome.ok
            if fault.healed_at is not None:
                mark.healed_s = self.timeline.at_s(fault.healed_at)
        return outcome

    def _watch(
        self,
        scenarios: Sequence[Scenario],
        faults: Sequence[Fault],
        leader: Leader,
        outcome: RoundResult,
    ) -> None:
        """Poll for the handover and heal what is due, until everything is healed and a
        required handover was seen (or its deadline passed).

        Handover time = from the fault (:attr:`Fault.started_at`) to the first poll that saw a
        newer epoch held by another node: resolution is the poll interval plus one query."""
        must = any(s.must_hand_over for s in scenarios)
        started = faults[0].started_at
        deadline = started + max(s.handover_timeout_s(self.target) for s in scenarios)
        seen: FenceState | None = None
        while True:
            now = time.monotonic()
            if seen is None:
                seen = newer_epoch(self._fence, leader)
                if seen is not None:
                    outcome.new_leader, outcome.new_epoch = seen.holder, seen.epoch
                    outcome.handover_ms = round((time.monotonic() - started) * 1000, 1)
            overdue = now >= deadline
            for fault in faults:
                due = fault.heal_at is not None and now >= fault.heal_at
                after_handover = fault.heal_at is None and (seen is not None or overdue)
                if not fault.healed and (due or after_handover):
                    self._heal(fault, outcome)
            healed = all(f.healed for f in faults)
            if must and seen is None and overdue:
                outcome.error = outcome.error or (
                    f"no new epoch within {deadline - started:.0f} s ({self._fence_text()})"
                )
                return
            if healed and (seen is not None or not must):
                return
            if overdue and healed:
                return
            time.sleep(FENCE_POLL_INTERVAL_S)

    def _measure(self, faults: Sequence[Fault], outcome: RoundResult, *, serving: bool) -> None:
        """Once ready again: the nodes restarted since the round began (another pid), the
        outage (fault to heal returned) and the time without a serving leader since the
        fault. With ``serving``, first wait (bounded) until a leader serves: the fence's
        holder may be first in the election and not serve yet (a node that kept its session
        across an outage and queues again)."""
        before, after = self._round_pids, self._node_pids
        outcome.node_restarts = sum(after.get(name) != pid for name, pid in before.items())
        started = faults[0].started_at
        healed = [f.heal_returned_at for f in faults if f.heal_returned_at is not None]
        outcome.outage_s = max(healed) - started if healed else None
        if serving:
            ready_s = self.timeline.now_s()
            try:
                wait_until(
                    lambda: (True if self.timeline.serving_since(ready_s) else None, "none"),
                    ready_timeout_s(self.target.session_timeout_ms),
                    READY_POLL_INTERVAL_S,
                    "a leader serving again",
                )
            except DrillError as exc:
                outcome.error = f"not ready again: {exc}"
        outcome.leaderless_s = self.timeline.leaderless_s(
            self.timeline.at_s(started), self.timeline.now_s()
        )

    def _note_successor(self, leader: Leader, outcome: RoundResult) -> None:
        """The fence's holder once a leader serves, if a newer term than ``leader``'s: a node
        that kept its session across an outage still holds the fence when the cluster is
        ready, and hands it on only after (the round would say nobody took over)."""
        if outcome.new_leader is not None:
            return
        try:
            fence = self._fence.read()
        except (AllocatorError, psycopg.Error) as exc:
            log.warning("fence_unreadable", error=str(exc))
            return
        if fence.holder is not None and fence.epoch > leader.epoch:
            outcome.new_leader, outcome.new_epoch = fence.holder, fence.epoch

    def _heal(self, fault: Fault, outcome: RoundResult) -> None:
        if fault.heal is None or fault.healed_at is not None:
            return
        fault.healed_at = time.monotonic()
        try:
            fault.heal()
        except (AllocatorError, OSError) as exc:
            outcome.error = outcome.error or f"{fault.scenario} not healed: {exc}"
            log.warning("heal_failed", scenario=fault.scenario, error=str(exc))
        else:
            fault.heal_returned_at = time.monotonic()

    def _heal_all(self, faults: Sequence[Fault], outcome: RoundResult) -> None:
        for fault in faults:
            self._heal(fault, outcome)

    def _fence_text(self) -> str:
        try:
            state = self._fence.read()
        except Exception as exc:
            return f"unreadable: {exc}"
        return f"epoch {state.epoch} held by {state.holder}"


def _record_claims(result: ScenarioResult, stats: ConsumerStats) -> None:
    result.claims = stats.claims
    result.claim_errors = stats.errors
    result.claim_error_kinds = stats.error_kinds
    result.claim_error_examples = stats.error_examples
    result.pool_empty = stats.pool_empty


def _round_line(label: str, outcome: RoundResult) -> str:
    faults = "+".join(outcome.faults)
    head = (
        f"{label} round {outcome.round} ({faults})"
        if label != faults
        else f"{label} round {outcome.round}"
    )
    if not outcome.ok:
        return f"{head}: FAILED: {outcome.error}"
    if outcome.handover_ms is None:
        moved = (
            f" -> {outcome.new_leader} (epoch {outcome.new_epoch})" if outcome.new_leader else ""
        )
        return f"{head}: {outcome.leader} (epoch {outcome.epoch}) kept or recovered{moved}"
    return (
        f"{head}: {outcome.leader} (epoch {outcome.epoch}) -> {outcome.new_leader} "
        f"(epoch {outcome.new_epoch}) in {outcome.handover_ms:.1f} ms"
    )

"""The node's collaborators one by one, on the fakes of :mod:`tests.fakes` (issue 20): each
built with its explicit dependencies, no :class:`~allocator.node.Node` around it. The whole
node on the same fakes is tests/unit/test_node_machine.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from kazoo.protocol.states import KazooState

from allocator import fence
from allocator.config import Config, load_config
from allocator.core.errors import FencedError
from allocator.core.health import NodeHealth
from allocator.core.leadership import SessionGuard, Term
from allocator.metrics import NodeMetrics
from allocator.node.blockers import (
    DATABASE_UNREACHABLE,
    FENCE_AHEAD,
    Blockers,
)
from allocator.node.candidacy import Candidacy, Taken
from allocator.node.exits import EXIT_FENCED
from allocator.node.handover import Handover
from allocator.node.leading import Leading
from allocator.node.pacing import Pacing
from allocator.node.pool_watch import PoolWatch
from allocator.node.probe import Prober
from allocator.node.session import ZooKeeperSession
from allocator.node.session_record import SessionRecorder
from allocator.node.signals import Signals
from allocator.node.term_end import RULES, TermEnd
from allocator.node.watermark import WatermarkKeeper
from allocator.session import file as session_file
from allocator.zookeeper import client as zkclient
from allocator.zookeeper.election import Election, Identity
from tests.fakes import (
    ClientFactory,
    FakeDatabase,
    FakeEnsemble,
    FakeJobs,
    FakeKazooClient,
    FakeMonotonic,
    FakeStore,
)

ELECTION = "/election"
AUTH = "allocator-test:not-a-real-secret"
FAST = Pacing(recheck_s=0.01, stale_takeover_backoff_s=0.0, blocked_retry_s=0.0)


def config(**settings: object) -> Config:
    return load_config(
        None,
        {
            "zookeeper.auth": AUTH,
            "node.name": "n",
            "node.admin_address": "127.0.0.1:0",
            "zookeeper.election_path": ELECTION,
            "leader.probe_interval_s": 0.05,
            **settings,
        },
        env={},
    )


def metric(metrics: NodeMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels or None)


def joined(ensemble: FakeEnsemble, name: str = "n", **advert: bool) -> Election:
    """A started client's election, our znode created."""
    client = FakeKazooClient(ensemble, auth=AUTH, default_acl=zkclient.acl(config()))
    client.start()
    election = Election(client, ELECTION, Identity(name, "host", 1, "", **advert))
    election.join()
    return election


# -- the term-end table --------------------------------------------------------------------------


def test_every_term_end_has_its_rule() -> None:
    assert set(RULES) == set(TermEnd)
    ends = dict(RULES.items())
    # a dead database path: hand over before any database call, record nothing
    assert ends[TermEnd.DB_UNREACHABLE].leave_first
    assert not ends[TermEnd.DB_UNREACHABLE].record_end
    # fenced: the fence moved on; nothing of ours is written, the node exits
    assert ends[TermEnd.FENCED].exits
    assert not ends[TermEnd.FENCED].record_end
    assert not ends[TermEnd.FENCED].leave
    # planned ends hand over at once and say why
    for reason in (TermEnd.SHUTDOWN, TermEnd.STEPPED_DOWN, TermEnd.CLOCK_SKEW, TermEnd.FATAL):
        assert ends[reason].record_end
        assert ends[reason].leave
    assert {r for r, rule in ends.items() if rule.role_after == "stopping"} == {
        TermEnd.SHUTDOWN,
        TermEnd.FATAL,
    }
    assert TermEnd("clock_skew") is TermEnd.CLOCK_SKEW  # the strings the database records


# -- blockers --------------------------------------------------------------------------------


def test_blocked_shows_its_reason_once_and_clears() -> None:
    metrics, signals = NodeMetrics(), Signals()
    blockers = Blockers("n", metrics, signals)
    blockers.block(DATABASE_UNREACHABLE, "no answer")
    assert signals.role == "blocked"
    assert blockers.reason() == DATABASE_UNREACHABLE
    assert metric(metrics, "allocator_blocked", reason=DATABASE_UNREACHABLE) == 1
    blockers.fence_is_ahead(fence.Token(0, 99), 0, 5)
    assert blockers.reason() == FENCE_AHEAD
    assert metric(metrics, "allocator_blocked", reason=DATABASE_UNREACHABLE) == 0
    assert metric(metrics, "allocator_fence_ahead_of_zookeeper") == 1
    blockers.clear_all()
    assert blockers.blocked is None
    assert blockers.fence_ahead is None
    assert metric(metrics, "allocator_blocked", reason=FENCE_AHEAD) == 0


# -- the watermark keeper --------------------------------------------------------------------


def test_the_watermark_follows_cuts_once_flushed_and_never_goes_down() -> None:
    election = joined(FakeEnsemble())
    keeper = WatermarkKeeper("n", Blockers("n", NodeMetrics(), Signals()))
    token = fence.Token(0, 7)
    keeper.raise_to(election, fence.Watermark(token, 100))
    keeper.record_cut(500)
    keeper.catch_up(election, token)  # within the rate limit: held back
    assert election.fence.watermark() == fence.Watermark(token, 100)
    keeper.flush(election, token)  # a term's end writes what was held back
    assert election.fence.watermark() == fence.Watermark(token, 500)
    keeper.raise_to(election, fence.Watermark(token, 300))
    assert keeper.read(election) == fence.Watermark(token, 500)


def test_a_database_below_the_watermark_is_reported_by_the_keeper() -> None:
    metrics = NodeMetrics()
    blockers = Blockers("n", metrics, Signals())
    keeper = WatermarkKeeper("n", blockers)
    election = joined(FakeEnsemble())
    token = fence.Token(0, 7)
    keeper.raise_to(election, fence.Watermark(token, 1000))
    assert keeper.database_went_back(999, token)
    assert blockers.database_behind is not None
    assert metric(metrics, "allocator_database_behind_zookeeper") == 1
    assert not keeper.database_went_back(1000, token)
    assert blockers.database_behind is None


# -- candidacy ---------------------------------------------------------------------------------


def candidacy(store: FakeStore, health: NodeHealth, signals: Signals) -> Candidacy:
    metrics = NodeMetrics()
    blockers = Blockers("n", metrics, signals)
    return Candidacy(
        "n",
        "host",
        1,
        store=store,
        health=health,
        metrics=metrics,
        blockers=blockers,
        watermark=WatermarkKeeper("n", blockers),
        signals=signals,
        pacing=FAST,
    )


def test_a_candidate_takes_the_fence_with_its_token() -> None:
    ensemble, database = FakeEnsemble(), FakeDatabase()
    election = joined(ensemble)
    taken = candidacy(FakeStore(database), NodeHealth(), Signals()).take(election)
    assert isinstance(taken, Taken)
    assert taken.token == fence.Token(0, election.token())
    assert database.fence().holder == "n"


def test_a_candidate_without_a_database_makes_way_for_a_fit_contender() -> None:
    ensemble = FakeEnsemble()
    election = joined(ensemble)
    joined(ensemble, "fit", db_ok=True, clock_ok=True)
    health, signals = NodeHealth(), Signals()
    health.probed(None, None)  # the probe did not reach the database
    store = FakeStore(FakeDatabase())
    assert candidacy(store, health, signals).take(election) is None
    assert election.znode is None  # left the queue
    assert signals.role == "follower"
    assert store.outcomes() == []  # never tried the dead path


def test_a_candidate_reads_no_generation_it_cannot_parse() -> None:
    ensemble = FakeEnsemble()
    ensemble.set_data(fence.generation_path(ELECTION), b"banana")
    signals = Signals()
    store = FakeStore(FakeDatabase())
    assert candidacy(store, NodeHealth(), signals).take(joined(ensemble)) is None
    assert signals.role == "blocked"
    assert store.outcomes() == []


def test_a_stale_takeover_behind_a_fence_ahead_of_zookeeper_blocks() -> None:
    ensemble = FakeEnsemble()
    database = FakeDatabase(fence=fence.Token(0, 2**40))  # a czxid this ensemble never issued
    election = joined(ensemble)
    signals = Signals()
    c = candidacy(FakeStore(database), NodeHealth(), signals)
    assert c.take(election) is None
    assert signals.role == "blocked"
    assert election.znode is not None  # stayed first: leaving would only churn


# -- handover ----------------------------------------------------------------------------------


def test_a_handover_is_due_only_with_a_fit_contender() -> None:
    clock = FakeMonotonic()
    health, metrics = NodeHealth(clock=clock), NodeMetrics()
    cfg = config(**{"leader.clock_skew_handover_s": 5.0})
    store = FakeStore(FakeDatabase())
    handover = Handover("n", cfg, health, PoolWatch(store, cfg, metrics), metrics)
    ensemble = FakeEnsemble()
    election = joined(ensemble)
    health.probed(1.0, False)  # the clock disagrees
    clock.advance(5.0)
    assert handover.due(election) is None
    assert handover.withheld == "clock_skew"
    assert metric(metrics, "allocator_handover_withheld") == 1
    joined(ensemble, "fit", db_ok=True, clock_ok=True)
    assert handover.due(election) == "clock_skew"


# -- the probe ---------------------------------------------------------------------------------


def prober(store: FakeStore, health: NodeHealth, metrics: NodeMetrics, cfg: Config) -> Prober:
    return Prober(
        "n",
        cfg,
        store=store,
        now_ms=lambda: 1_700_000_000_000,
        health=health,
        metrics=metrics,
        pool_watch=PoolWatch(store, cfg, metrics),
        guard=SessionGuard(10.0),
        closing=threading.Event(),
        pacing=FAST,
        identity=lambda: Identity("n", "host", 1, ""),
        election=lambda: None,
    )


def test_a_probe_records_reachability_and_the_clock() -> None:
    cfg, health, metrics = config(), NodeHealth(), NodeMetrics()
    store = FakeStore(FakeDatabase(), clock_offset_ms=5_000.0)
    probe = prober(store, health, metrics, cfg)
    probe.probe_once()
    assert (health.advert().db_ok, health.advert().clock_ok) == (True, False)
    assert metric(metrics, "allocator_clock_skew_alert") == 1
    store.reachable = False
    probe.probe_once()
    assert health.advert().db_ok is False
    assert metric(metrics, "allocator_database_reachable") == 0


# -- the session and its file --------------------------------------------------------------------


def test_a_session_starts_and_a_recovery_without_a_znode_closes_it_for_a_new_one(
    tmp_path: Path,
) -> None:
    cfg = config(**{"node.state_dir": str(tmp_path / "state")})
    ensemble = FakeEnsemble()
    factory = ClientFactory(ensemble, auth=AUTH, default_acl=zkclient.acl(cfg))
    guard, signals, paused = SessionGuard(10.0), Signals(), []
    recorder = SessionRecorder(cfg, "n", "host", 1)
    recorder.prepare()
    pairs: list[tuple[object, object]] = []  # (session, election) each time a session is recorded
    record_session = recorder.record

    def recording(credentials: tuple[int, bytes] | None) -> None:
        pairs.append((session.credentials(), session.election))
        record_session(credentials)

    recorder.record = recording  # type: ignore[method-assign]
    session = ZooKeeperSession(
        cfg,
        "n",
        factory=factory,
        root_factory=None,
        guard=guard,
        metrics=NodeMetrics(),
        signals=signals,
        pacing=FAST,
        recorder=recorder,
        identity=lambda: Identity("n", "host", 1, ""),
        pause_term=lambda: paused.append(True),
    )
    election = session.start()
    first = session.credentials()
    assert first is not None
    assert session.state() == "connected"
    record = session_file.read(tmp_path / "state")
    assert record is not None
    assert record.session_id == first[0]
    session._on_state(KazooState.SUSPENDED)  # what kazoo's listener gets
    assert paused
    assert not guard.connected
    assert session.recover() is False  # alive, but no znode of ours to keep
    assert len(factory.built) == 2
    assert factory.built[0].closed
    second = session.credentials()
    assert second is not None
    assert second != first
    assert ensemble.closed_sessions == [first[0]]  # closed before the new one was opened
    assert session.election is not None
    assert session.election is not election
    # While the new session was being recorded, nothing showed it with the old election.
    assert (second, election) not in pairs
    session.close()
    assert session_file.read(tmp_path / "state") is None


# -- leading -----------------------------------------------------------------------------------


class Led:
    """A term led on the fakes, in a thread of its own (as the node's run loop leads)."""

    def __init__(self) -> None:
        self.database = FakeDatabase()
        store = FakeStore(self.database, available_blocks=1_000_000)  # the fake jobs cut nothing
        self.election = joined(FakeEnsemble())
        self.signals, self.jobs = Signals(), FakeJobs()
        metrics, health, cfg = NodeMetrics(), NodeHealth(), config()
        self.jobs.start_scheduler()
        taken = candidacy(store, health, self.signals).take(self.election)
        assert isinstance(taken, Taken)
        self.token = taken.token
        guard = SessionGuard(10.0)
        guard(KazooState.CONNECTED)
        pool_watch = PoolWatch(store, cfg, metrics)
        self.leading = Leading(
            "n",
            store=store,
            jobs=self.jobs,
            health=health,
            metrics=metrics,
            pool_watch=pool_watch,
            guard=guard,
            handover=Handover("n", cfg, health, pool_watch, metrics),
            watermark=WatermarkKeeper("n", Blockers("n", metrics, self.signals)),
            signals=self.signals,
            pacing=FAST,
            term_factory=Term,
            check_clock=lambda: None,
        )
        self.result: list[int | None] = []
        self._thread = threading.Thread(
            target=lambda: self.result.append(
                self.leading.lead(self.election, taken.token, taken.takeover)
            )
        )
        self._thread.start()
        while self.jobs.term is None:
            threading.Event().wait(0.01)

    def ended(self) -> int | None:
        self._thread.join(5.0)
        assert not self._thread.is_alive()
        return self.result[0]

    def recorded_end(self) -> str | None:
        term = self.database.term_of(self.token)
        assert term is not None
        return term.end_reason


def test_a_term_led_then_fenced_exits_4_and_records_nothing() -> None:
    led = Led()
    assert led.signals.role == "leader"
    assert led.leading.term is not None
    led.jobs.hooks.on_fenced(FencedError("fenced (fake)"))
    assert led.ended() == EXIT_FENCED
    assert led.jobs.stops == 1
    assert led.recorded_end() is None  # the fence moved on: not recorded by us
    assert led.election.znode is not None  # not left: the session's close removes it


def test_a_stepped_down_term_is_recorded_and_hands_over() -> None:
    led = Led()
    assert led.leading.request_step_down()
    assert led.ended() is None
    assert led.recorded_end() == TermEnd.STEPPED_DOWN.value
    assert led.election.znode is None  # left: the next contender takes over at once
    assert led.signals.role == "follower"


def test_a_term_end_deletes_the_znode_only_once_the_end_is_recorded_and_the_watermark_flushed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    led = Led()
    led.jobs.hooks.cut_recorded(500)  # a cut the watermark's rate limit held back
    seen: list[tuple[str | None, fence.Watermark | None]] = []
    delete = led.election.leave

    def leave() -> None:
        seen.append((led.recorded_end(), led.election.fence.watermark()))
        delete()

    monkeypatch.setattr(led.election, "leave", leave)
    assert led.leading.request_step_down()
    assert led.ended() is None
    assert led.jobs.stops == 1
    assert seen == [(TermEnd.STEPPED_DOWN.value, fence.Watermark(led.token, 500))]
    assert led.election.znode is None


def test_a_takeovers_pipelined_reads_give_what_the_single_reads_give() -> None:
    election = joined(FakeEnsemble())
    reads = election.fence.start_reads()
    assert (reads.generation(), reads.watermark()) == (0, None)  # neither znode yet
    mark = fence.Watermark(fence.Token(0, 7), 100)
    election.fence.raise_watermark(mark)
    reads = election.fence.start_reads()
    assert reads.generation() == election.fence.generation() == 0
    assert reads.watermark() == election.fence.watermark() == mark

"""The node's state machine without servers: real :class:`~allocator.node.Node` objects on the
in-memory fakes of :mod:`tests.fakes` (ZooKeeper ensemble and clients, database, leader jobs,
the health record's monotonic clock).

Each test runs its nodes in threads and drives them from outside, through the fakes' controls
only (expire a session, wipe the ensemble, cut a node off the database, skew its clock, play
the jobs' part), then waits for what the node must do: its role, exit code, znode, metrics,
``/status`` snapshot, and what it told the database and its jobs.

Rules: tests assert behaviour, never timing. Every wait polls a condition up to a deadline;
nothing sleeps to "let things settle". Every node thread is stopped with ``request_stop`` and
joined with a timeout by the ``cluster`` fixture, whatever the test did. Time that the rules
measure (clock skew, no successful write) passes on the fake clock, by ``advance``. The node's
pacing (re-check, handover check, back-offs: :class:`~allocator.node.Pacing`) is shortened so
the file runs in seconds; no assertion depends on it.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

import pytest
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import make_digest_acl

from allocator import fence
from allocator.config import Config, load_config
from allocator.core.errors import ConfigError, LayoutMismatchError, SchemaMismatchError
from allocator.core.health import NodeHealth
from allocator.core.leadership import Term
from allocator.fence import Token
from allocator.node import EXIT_CONFIG, EXIT_FENCED, EXIT_OK, EXIT_SESSION_LOST, Node, Pacing
from allocator.postgres.compat import SchemaStamp
from allocator.zookeeper import client as zkclient
from allocator.zookeeper.election import Identity, ordered, sequence_of
from tests import output_schemas
from tests.fakes import (
    DEFAULT_LAYOUT,
    ClientFactory,
    FakeDatabase,
    FakeEnsemble,
    FakeJobs,
    FakeKazooClient,
    FakeMonotonic,
    FakeStore,
)

T = TypeVar("T")

ELECTION = "/election"
WAIT_S = 10.0
POLL_S = 0.01
ENSEMBLE_EPOCH = 5
"""The fixture's ensemble has had a few ZooKeeper leader epochs; a wiped one restarts at 1."""
CLOCK_SKEW_HANDOVER_S = 10.0
DB_UNREACHABLE_S = 15.0
SKEWED_MS = 5_000.0
"""Far beyond ``pool.max_clock_skew_ms`` (500 by default)."""
FULL_POOL_BLOCKS = 1_000_000
"""What the fake store reports of the pool unless a test empties it (the fake jobs cut nothing)."""
ZK_AUTH = "allocator-test:not-a-real-secret"
"""The nodes' ``zookeeper.auth``: the default path, every znode under our ACL."""
FAST_PACING = Pacing(
    recheck_s=0.02,
    handover_check_s=0.02,
    stale_takeover_backoff_s=0.02,
    blocked_retry_s=0.02,
    election_scan_s=0.02,
    zookeeper_error_backoff_s=0.02,
    rejoin_attempt_s=0.02,
)


def wait_for(what: str, condition: Callable[[], T | Literal[False] | None]) -> T:
    """Poll ``condition`` until it returns something true (returned) or ``WAIT_S`` passes."""
    deadline = time.monotonic() + WAIT_S
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        time.sleep(POLL_S)


def node_config(name: str, settings: Mapping[str, object]) -> Config:
    return load_config(
        None,
        {
            "zookeeper.auth": ZK_AUTH,
            "node.name": name,
            "node.admin_address": "127.0.0.1:0",
            "zookeeper.election_path": ELECTION,
            "zookeeper.session_timeout_ms": 400,  # the node's own suspension timer
            "leader.probe_interval_s": 0.02,
            "leader.clock_skew_handover_s": CLOCK_SKEW_HANDOVER_S,
            "leader.db_unreachable_s": DB_UNREACHABLE_S,
            **settings,
        },
        env={},
    )


def name_of(znode: str) -> str:
    return znode.rsplit("/", 1)[1]


def sequence(znode: str) -> int:
    return sequence_of(name_of(znode))


@dataclass
class Member:
    """One node under test, its own fakes, and the thread running it."""

    node: Node
    ensemble: FakeEnsemble
    store: FakeStore
    jobs: FakeJobs
    clock: FakeMonotonic
    clients: ClientFactory
    thread: threading.Thread | None = None
    exit_code: int | None = None
    error: Exception | None = None

    @property
    def name(self) -> str:
        return self.node.name

    def start(self) -> Member:
        self.thread = threading.Thread(target=self._run, name=f"node-{self.name}", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            self.exit_code = self.node.run()
        except Exception as exc:  # reported by wait_exit / the fixture
            self.error = exc

    def wait_exit(self) -> int:
        """The node's exit code, once it ended by itself."""
        assert self.thread is not None
        self.thread.join(WAIT_S)
        if self.thread.is_alive():
            raise AssertionError(f"node {self.name} did not exit within {WAIT_S} s")
        if self.error is not None:
            raise AssertionError(f"node {self.name} failed: {self.error!r}") from self.error
        assert self.exit_code is not None
        return self.exit_code

    # -- what the test observes ---------------------------------------------------------

    def leading(self) -> Term | None:
        """The term this node leads in, while its jobs run and it may write."""
        term = self.jobs.term
        if term is None or not term.may_write() or self.node.role != "leader":
            return None
        return term

    def znode(self) -> str | None:
        znode: str | None = self.node.snapshot()["znode"]
        return znode

    def advert(self) -> Identity | None:
        """What this node's znode advertises (None while it has none)."""
        znode = self.znode()
        if znode is None:
            return None
        try:
            return Identity.from_bytes(self.ensemble.data(znode))
        except NoNodeError:
            return None

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.node.metrics.registry.get_sample_value(name, labels)


class Cluster:
    """The fakes one test shares (an ensemble, a database) and the nodes it started."""

    def __init__(self, ensemble: FakeEnsemble) -> None:
        self.ensemble = ensemble
        self.database = FakeDatabase()
        self.members: list[Member] = []
        self._clients: list[FakeKazooClient] = []

    def node(
        self,
        name: str,
        settings: Mapping[str, object] | None = None,
        *,
        clock_offset_ms: float = 0.0,
    ) -> Member:
        """Start a node named ``name``; the database's clock is ``clock_offset_ms`` off its."""
        config = node_config(name, settings or {})
        clients = ClientFactory(
            self.ensemble,
            auth=config.zookeeper.auth.get_secret_value(),
            default_acl=zkclient.acl(config),
        )
        # A full pool unless a test empties it: the fake jobs cut nothing.
        store = FakeStore(
            self.database, clock_offset_ms=clock_offset_ms, available_blocks=FULL_POOL_BLOCKS
        )
        jobs = FakeJobs()
        clock = FakeMonotonic()
        node = Node(
            config,
            store=store,
            zookeeper=clients,
            jobs=jobs,
            health=NodeHealth(clock=clock),
            pacing=FAST_PACING,
        )
        member = Member(node, self.ensemble, store, jobs, clock, clients)
        self.members.append(member)
        return member.start()

    def contender(self, identity: Identity) -> tuple[FakeKazooClient, str]:
        """A queued contender that is no node: a znode of its own session, for its data."""
        client = self.ensemble.client(auth=ZK_AUTH)
        self._clients.append(client)
        client.start()
        prefix = f"{ELECTION}/n-{uuid.uuid4().hex}-"
        znode = client.create_async(prefix, identity.to_bytes(), ephemeral=True, sequence=True)
        return client, znode.get()

    def stop(self) -> None:
        """Stop every node (request_stop), join each with a timeout, report what went wrong."""
        for member in self.members:
            member.node.request_stop("test over")
        problems: list[str] = []
        first_error: Exception | None = None
        for member in self.members:
            assert member.thread is not None
            member.thread.join(WAIT_S)
            if member.thread.is_alive():
                problems.append(f"node {member.name} did not stop within {WAIT_S} s")
            elif member.error is not None:
                problems.append(f"node {member.name} failed: {member.error!r}")
                first_error = first_error or member.error
        for client in self._clients:
            client.stop()
            client.close()
        if problems:
            raise AssertionError("; ".join(problems)) from first_error


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    cluster = Cluster(FakeEnsemble(epoch=ENSEMBLE_EPOCH))
    try:
        yield cluster
    finally:
        cluster.stop()


def fit(name: str = "contender") -> Identity:
    return Identity(name, "elsewhere", 1, "", db_ok=True, clock_ok=True)


# -- the baseline ------------------------------------------------------------------------------


def test_a_node_takes_the_fence_with_its_znodes_czxid_and_stops_gracefully(
    cluster: Cluster,
) -> None:
    a = cluster.node("a")
    term = wait_for("a leads", a.leading)
    znode = a.znode()
    assert znode is not None
    assert term.token == Token(0, cluster.ensemble.stat(znode).czxid)
    assert cluster.database.fence().holder == "a"

    a.node.request_stop("test")

    assert a.wait_exit() == EXIT_OK
    assert term.end_reason == "shutdown"
    ended = cluster.database.term_of(term.token)
    assert ended is not None
    assert ended.end_reason == "shutdown"
    assert not cluster.ensemble.exists(znode)
    assert a.jobs.stops == 1
    assert a.jobs.shut_down
    assert a.store.closed
    assert a.clients.latest.closed
    assert cluster.ensemble.live_sessions() == set()


# -- clock disagreement ----------------------------------------------------------------------


def test_a_leader_whose_clock_disagrees_withholds_handover_until_a_fit_contender_queues(
    cluster: Cluster,
) -> None:
    a = cluster.node("a", clock_offset_ms=SKEWED_MS)
    term = wait_for("a leads", a.leading)
    # The probe at takeover found the clock off: what the jobs see says "do not cut".
    assert a.jobs.health.advert().clock_ok is False
    assert a.metric("allocator_clock_skew_alert") == 1
    assert a.node.snapshot()["clock_agrees"] is False
    contender, contender_znode = cluster.contender(
        Identity("c", "elsewhere", 1, "", db_ok=True, clock_ok=False)
    )

    a.clock.advance(CLOCK_SKEW_HANDOVER_S)

    wait_for("handover withheld", lambda: a.metric("allocator_handover_withheld") == 1)
    snapshot = a.node.snapshot()
    assert snapshot["handover_withheld"] == "clock_skew"
    assert snapshot["role"] == "leader"
    assert a.leading() is term
    assert a.jobs.stops == 0
    assert cluster.ensemble.exists(snapshot["znode"])

    contender.set_async(contender_znode, fit("c").to_bytes()).get()

    rejoined = wait_for(
        "a hands over and queues behind the contender",
        lambda: (z := a.znode()) is not None and sequence(z) > sequence(contender_znode) and z,
    )
    assert term.end_reason == "clock_skew"
    ended = cluster.database.term_of(term.token)
    assert ended is not None
    assert ended.end_reason == "clock_skew"
    assert a.node.role == "follower"
    assert a.jobs.term is None
    assert a.jobs.stops == 1
    assert a.metric("allocator_handover_withheld") == 0
    assert a.node.snapshot()["handover_withheld"] is None
    assert ordered(cluster.ensemble.children(ELECTION)) == [
        name_of(contender_znode),
        name_of(rejoined),
    ]


# -- database unreachable --------------------------------------------------------------------


def test_a_leader_that_cannot_reach_the_database_hands_over_only_to_one_that_can(
    cluster: Cluster,
) -> None:
    a = cluster.node("a")
    term_a = wait_for("a leads", a.leading)
    b = cluster.node("b")
    wait_for("b queues and advertises it is fit", lambda: (i := b.advert()) and i.fit)
    a.jobs.report_write()

    a.store.reachable = b.store.reachable = False  # the database is down for everyone
    wait_for("b advertises no database", lambda: (i := b.advert()) and i.db_ok is False)
    wait_for("a's probe fails", lambda: a.metric("allocator_database_reachable") == 0)
    a.clock.advance(DB_UNREACHABLE_S)

    wait_for("handover withheld", lambda: a.metric("allocator_handover_withheld") == 1)
    assert a.node.snapshot()["handover_withheld"] == "db_unreachable"
    assert a.leading() is term_a
    assert a.jobs.stops == 0

    b.store.reachable = True

    term_b = wait_for("b leads", b.leading)
    assert term_b.token > term_a.token
    assert term_a.end_reason == "db_unreachable"
    assert cluster.database.fence().holder == "b"
    superseded = cluster.database.term_of(term_a.token)  # a could not record its own end
    assert superseded is not None
    assert superseded.end_reason == "superseded"
    b_znode = b.znode()
    assert b_znode is not None
    wait_for(
        "a queues behind b",
        lambda: (z := a.znode()) is not None and sequence(z) > sequence(b_znode),
    )
    assert a.node.role == "follower"
    assert a.jobs.stops == 1
    assert a.metric("allocator_handover_withheld") == 0


def test_a_contender_that_cannot_reach_the_database_makes_way_for_one_that_can(
    cluster: Cluster,
) -> None:
    """Issue 19, item 1: B is cut off from the database after it queued, C queues behind it;
    A stops gracefully: B, first now, leaves at once for C (C advertises a reachable
    database) and never tries a takeover on its dead path."""
    a = cluster.node("a")
    wait_for("a leads", a.leading)
    b = cluster.node("b")
    wait_for("b queues and advertises it is fit", lambda: (i := b.advert()) and i.fit)
    b.store.reachable = False
    wait_for("b advertises no database", lambda: (i := b.advert()) and i.db_ok is False)
    c = cluster.node("c")
    wait_for("c queues and advertises it is fit", lambda: (i := c.advert()) and i.fit)

    a.node.request_stop("test")

    term_c = wait_for("c leads", c.leading)
    assert cluster.database.fence().holder == "c"
    assert term_c.token.epoch == cluster.ensemble.stat(c.znode() or "").czxid
    assert b.store.outcomes() == []  # b made way without trying its dead path
    c_znode = c.znode()
    assert c_znode is not None
    wait_for(
        "b queues again behind c",
        lambda: (z := b.znode()) is not None and sequence(z) > sequence(c_znode),
    )
    assert b.node.role == "follower"
    assert b.node.snapshot()["blocked"] is None


def test_a_first_contender_without_a_database_is_blocked_until_it_reaches_it(
    cluster: Cluster,
) -> None:
    """Issue 19, item 1: with nobody fit behind it, a contender that cannot reach the
    database stays first (no churn) and says why: role ``blocked``, reason
    ``database_unreachable`` in /status, its advert and ``allocator_blocked``. A contender
    that queues later and reaches the database gets the lead at once; here the database
    comes back first, and the blocked node takes over."""
    a = cluster.node("a")
    wait_for("a leads", a.leading)
    b = cluster.node("b")
    wait_for("b queues and advertises it is fit", lambda: (i := b.advert()) and i.fit)
    b.store.reachable = False
    wait_for("b advertises no database", lambda: (i := b.advert()) and i.db_ok is False)

    a.node.request_stop("test")

    blocked = wait_for(
        "b reports itself blocked",
        lambda: (s := b.node.snapshot())["role"] == "blocked" and s["blocked"] and s,
    )
    assert blocked["blocked"]["reason"] == "database_unreachable"
    output_schemas.assert_valid("node-status", blocked)
    assert b.metric("allocator_blocked", {"reason": "database_unreachable"}) == 1
    assert b.metric("allocator_blocked", {"reason": "fence_ahead_of_zookeeper"}) == 0
    wait_for(
        "b advertises it is blocked",
        lambda: (i := b.advert()) and i.blocked == "database_unreachable",
    )
    assert cluster.ensemble.children(ELECTION) == [name_of(blocked["znode"])]  # stayed first

    b.store.reachable = True

    wait_for("b leads", b.leading)
    assert b.node.snapshot()["blocked"] is None
    assert b.metric("allocator_blocked", {"reason": "database_unreachable"}) == 0
    wait_for("b's advert drops the reason", lambda: (i := b.advert()) and i.blocked is None)


def test_a_leader_whose_clock_disagrees_hands_over_at_once_while_the_pool_is_short(
    cluster: Cluster,
) -> None:
    """Issue 19, item 7: a cold pool and a leader whose clock is wrong (it may not cut): a
    fit contender gets the lead at once, not after ``leader.clock_skew_handover_s`` (the
    fake clock advances by a second only: the clock has disagreed for more than one probe,
    so this is no single noisy reading)."""
    a = cluster.node("a", clock_offset_ms=SKEWED_MS)
    a.store.available_blocks = 0
    term = wait_for("a leads", a.leading)
    assert a.jobs.health.advert().clock_ok is False
    a.clock.advance(1.0)
    b = cluster.node("b")

    wait_for("b leads", b.leading)
    assert term.end_reason == "clock_skew"
    assert cluster.database.fence().holder == "b"


def test_an_unreadable_fence_generation_blocks_the_first_node_until_rewritten(
    cluster: Cluster,
) -> None:
    """Issue 19, item 8: a generation past bigint (20 digits) cannot be parsed: the first
    node is ``blocked`` with the reason shown, stays first and takes no fence; once the
    generation is rewritten (what ``allocator fence rebase`` does) it leads."""
    cluster.ensemble.set_generation(ELECTION, 0)
    cluster.ensemble.set_data(fence.generation_path(ELECTION), str(2**64).encode())
    a = cluster.node("a")

    blocked = wait_for(
        "a reports itself blocked",
        lambda: (s := a.node.snapshot())["role"] == "blocked" and s["blocked"] and s,
    )
    assert blocked["blocked"]["reason"] == "fence_generation_unreadable"
    assert "past the largest generation" in blocked["blocked"]["detail"]
    output_schemas.assert_valid("node-status", blocked)
    assert a.metric("allocator_blocked", {"reason": "fence_generation_unreadable"}) == 1
    assert a.store.outcomes() == []

    cluster.ensemble.set_generation(ELECTION, 1)

    term = wait_for("a leads", a.leading)
    assert term.token.generation == 1
    assert a.node.snapshot()["blocked"] is None


def test_a_watermark_past_bigint_is_ignored_and_replaced_by_the_leader(cluster: Cluster) -> None:
    """Issue 19, item 8: one bad write of the watermark (a mark of 2^70) must not stop every
    takeover for good: it does not parse, so it is reported and ignored, and the leader's
    first raise replaces it with what the database holds."""
    path = fence.watermark_path(ELECTION)
    cluster.ensemble.set_generation(ELECTION, 0)
    cluster.ensemble.set_data(path, b'{"generation": 0, "epoch": 1, "high_water_id": %d}' % 2**70)
    a = cluster.node("a")

    term = wait_for("a leads", a.leading)
    assert fence.Watermark.from_bytes(cluster.ensemble.data(path)) == fence.Watermark(
        term.token, cluster.database.high_water_id
    )


# -- the fence ahead of ZooKeeper ------------------------------------------------------------


def test_a_fence_ahead_of_a_wiped_ensemble_is_reported_without_churn_until_rebased(
    cluster: Cluster,
) -> None:
    a = cluster.node("a", {"node.on_session_loss": "rejoin"})
    old = wait_for("a leads", a.leading)
    assert old.token.epoch >> 32 == ENSEMBLE_EPOCH

    cluster.ensemble.wipe()

    # The old client stays suspended (a rebuilt ensemble refuses it); the node's own timer
    # declares the session lost, and it rejoins on a new client, with a token from epoch 1.
    blocked = wait_for(
        "a reports the fence ahead",
        lambda: (
            (s := a.node.snapshot())["role"] == "blocked" and s["fence_ahead_of_zookeeper"] and s
        ),
    )
    assert len(a.clients.built) == 2
    assert a.clients.built[0].closed
    assert old.end_reason == "session_lost"
    znode = blocked["znode"]
    assert blocked["fence_ahead_of_zookeeper"] == {
        "fence": {"generation": 0, "epoch": old.token.epoch},
        "zookeeper": {"generation": 0, "newest_zxid": cluster.ensemble.stat(ELECTION).pzxid},
    }
    output_schemas.assert_valid("node-status", blocked)
    assert a.metric("allocator_fence_ahead_of_zookeeper") == 1
    refusals = a.store.outcomes().count("stale")
    wait_for("a retries", lambda: a.store.outcomes().count("stale") >= refusals + 2)
    assert cluster.ensemble.children(ELECTION) == [name_of(znode)]  # stayed first, no churn
    assert a.znode() == znode
    assert a.jobs.terms == [old]

    rebase = cluster.database.rebase()  # the operator's `allocator fence rebase`
    cluster.ensemble.set_generation(ELECTION, rebase.new_generation)

    new = wait_for("a leads again", lambda: (t := a.leading()) is not old and t)
    assert new.token == Token(1, cluster.ensemble.stat(znode).czxid)
    assert a.znode() == znode
    assert a.node.snapshot()["fence_ahead_of_zookeeper"] is None
    assert a.metric("allocator_fence_ahead_of_zookeeper") == 0
    history = cluster.database.history()
    assert [(t.generation, t.end_reason) for t in history] == [(0, "rebased"), (1, None)]


def test_a_database_below_zookeepers_watermark_is_reported_and_not_taken_over(
    cluster: Cluster,
) -> None:
    a = cluster.node("a")
    first = wait_for("a leads", a.leading)
    watermark_path = fence.watermark_path(ELECTION)
    # Raised at the takeover: the token, and the mark the database had then.
    assert fence.Watermark.from_bytes(cluster.ensemble.data(watermark_path)) == fence.Watermark(
        first.token, cluster.database.high_water_id
    )
    # The database is restored to before a cut ZooKeeper saw committed.
    cluster.ensemble.set_data(watermark_path, fence.Watermark(first.token, 5000).to_bytes())
    b = cluster.node("b")
    wait_for("b queues", lambda: b.node.snapshot()["role"] == "follower")
    assert a.node.request_step_down()
    blocked = wait_for(
        "b reports the database behind",
        lambda: (
            (s := b.node.snapshot())["role"] == "blocked" and s["database_behind_zookeeper"] and s
        ),
    )
    assert blocked["database_behind_zookeeper"]["watermark"]["high_water_id"] == 5000
    output_schemas.assert_valid("node-status", blocked)
    assert (
        "high-water mark -1 is below the watermark's 5000"
        in (blocked["database_behind_zookeeper"]["reason"])
    )
    assert b.metric("allocator_database_behind_zookeeper") == 1
    assert b.leading() is None
    assert [t.holder for t in cluster.database.history()] == ["a"]  # no takeover tried

    cluster.database.high_water_id = 5001  # the operator's reset moves the mark past it
    second = wait_for("b leads", b.leading)
    assert second.token > first.token
    assert b.node.snapshot()["database_behind_zookeeper"] is None
    assert b.metric("allocator_database_behind_zookeeper") == 0
    assert fence.Watermark.from_bytes(cluster.ensemble.data(watermark_path)) == fence.Watermark(
        second.token, 5001
    )


# -- session loss ----------------------------------------------------------------------------


EXIT_ON_LOSS = {"node.on_session_loss": "exit"}


def test_session_expiry_of_the_leader_exits_with_code_3(cluster: Cluster) -> None:
    a = cluster.node("a", EXIT_ON_LOSS)
    term = wait_for("a leads", a.leading)
    znode = a.znode()
    assert znode is not None
    session = a.clients.latest.client_id
    assert session is not None

    cluster.ensemble.expire(session[0])

    assert a.wait_exit() == EXIT_SESSION_LOST
    # Over as "session_lost", or as "znode_lost" when the leader's re-check ran on kazoo's
    # fresh session before the node saw LOST (a real interleaving): the label is not the point.
    assert term.ended
    assert not term.may_write()
    assert a.jobs.stops == 1
    assert not cluster.ensemble.exists(znode)
    assert len(a.clients.built) == 1
    assert a.clients.latest.closed
    assert cluster.ensemble.live_sessions() == set()  # kazoo's fresh session closed too


def test_session_expiry_of_a_follower_exits_with_code_3_and_the_leader_stays(
    cluster: Cluster,
) -> None:
    a = cluster.node("a")
    term = wait_for("a leads", a.leading)
    b = cluster.node("b", EXIT_ON_LOSS)
    wait_for("b queues", lambda: b.node.role == "follower" and b.znode())
    session = b.clients.latest.client_id
    assert session is not None

    cluster.ensemble.expire(session[0])

    assert b.wait_exit() == EXIT_SESSION_LOST
    assert b.jobs.terms == []
    assert a.leading() is term
    assert a.jobs.stops == 0
    a_znode = a.znode()
    assert a_znode is not None
    assert cluster.ensemble.children(ELECTION) == [name_of(a_znode)]


def test_session_expiry_with_rejoin_builds_a_new_client_and_joins_again(cluster: Cluster) -> None:
    a = cluster.node("a")  # rejoin: the default
    first = wait_for("a leads", a.leading)
    first_client = a.clients.latest
    first_znode = a.znode()
    session = first_client.client_id
    assert session is not None
    assert first_znode is not None

    cluster.ensemble.expire(session[0])

    second = wait_for("a leads again", lambda: (t := a.leading()) is not first and t)
    assert first.ended  # "session_lost" or "znode_lost", as in the test above
    assert len(a.clients.built) == 2
    assert first_client.closed
    # kazoo gave the old client a fresh session by itself; closing the client ended it too.
    assert set(first_client.sessions).isdisjoint(cluster.ensemble.live_sessions())
    new_session = a.clients.latest.client_id
    assert new_session is not None
    assert a.node.snapshot()["session_id"] == f"{new_session[0]:#x}"
    znode = a.znode()
    assert znode is not None
    assert znode != first_znode
    assert not cluster.ensemble.exists(first_znode)
    assert cluster.ensemble.stat(znode).ephemeralOwner == new_session[0]
    assert second.token > first.token
    history = cluster.database.history()
    assert [t.ended_at is not None for t in history] == [True, False]


def session_of(member: Member) -> int | None:
    """The node's live session (``/status``), None while it has none."""
    session_id: str | None = member.node.snapshot()["session_id"]
    return None if session_id is None else int(session_id, 16)


def wait_loss_handled(member: Member, clients_before: int) -> None:
    """Until ``member`` declared its session lost and tried a client of its own to get back."""
    wait_for(
        f"{member.name} handles the loss",
        lambda: len(member.clients.built) > clients_before,
    )


def test_an_outage_past_the_timeout_keeps_the_sessions_and_the_fence_is_taken_anew(
    cluster: Cluster,
) -> None:
    """Every server out of reach past the session timeout (a quorum loss), then back with
    the sessions alive: the leader's term ends as on any loss, nobody restarts or opens a
    new session, the queue keeps its order, and the next term comes from a takeover with a
    new token, never the old one resumed."""
    a = cluster.node("a")
    old = wait_for("a leads", a.leading)
    b = cluster.node("b")
    wait_for("b queues", lambda: b.node.role == "follower" and b.znode())
    sessions = {m.name: session_of(m) for m in (a, b)}
    b_znode = b.znode()

    cluster.ensemble.partition()

    wait_loss_handled(a, 1)
    wait_loss_handled(b, 1)
    assert old.ended
    assert old.end_reason == "session_lost"
    assert not old.may_write()
    assert a.jobs.stops == 1
    assert a.leading() is None
    assert cluster.database.history()[-1].ended_at is None  # no write, end_term included
    assert a.node.snapshot()["session"] == "lost"
    healthz = a.node.snapshot()["admin_url"] + "/healthz"
    with urllib.request.urlopen(healthz, timeout=WAIT_S) as answer:  # noqa: S310 (http://)
        assert answer.status == 200  # alive, rejoining: a liveness probe must not kill it

    cluster.ensemble.heal()

    new = wait_for("b leads", b.leading)
    assert {m.name: session_of(m) for m in (a, b)} == sessions  # both sessions kept
    assert [event for event, _ in cluster.ensemble.session_events].count("open") == 2
    assert cluster.ensemble.closed_sessions == []
    assert b.znode() == b_znode
    assert new.token > old.token
    assert a.jobs.terms == [old]  # a took nothing again with its spent token
    a_znode = wait_for("a queues again", lambda: a.node.role == "follower" and a.znode())
    assert sequence(a_znode) > sequence(b_znode)  # at the back, behind b
    assert cluster.ensemble.stat(a_znode).ephemeralOwner == sessions["a"]
    assert [t.holder for t in cluster.database.history()] == ["a", "b"]
    assert a.exit_code is None
    assert b.exit_code is None


def test_a_lone_leader_back_from_an_outage_takes_the_fence_again_before_writing(
    cluster: Cluster,
) -> None:
    a = cluster.node("a")
    old = wait_for("a leads", a.leading)
    session = session_of(a)

    cluster.ensemble.partition()
    wait_loss_handled(a, 1)
    cluster.ensemble.heal()

    new = wait_for("a leads again", lambda: (t := a.leading()) is not old and t)
    assert session_of(a) == session
    assert new.token > old.token  # a new znode's czxid: a takeover, not a resume
    assert a.jobs.terms == [old, new]
    assert a.store.outcomes().count("stale") == 0  # it never offered the spent token
    a.jobs.report_write()
    assert [t.holder for t in cluster.database.history()] == ["a", "a"]


def test_a_session_confirmed_without_its_znode_is_closed_before_a_new_one_opens(
    cluster: Cluster,
) -> None:
    a = cluster.node("a")
    old = wait_for("a leads", a.leading)
    session = session_of(a)
    assert session is not None
    znode = a.znode()
    assert znode is not None

    cluster.ensemble.partition()
    wait_loss_handled(a, 1)
    cluster.ensemble.delete(znode)  # gone while the session lives on
    cluster.ensemble.heal()

    new = wait_for("a leads again", lambda: (t := a.leading()) is not old and t)
    events = cluster.ensemble.session_events
    resumed = events.index(("resume", session))
    closed = events.index(("close", session))
    fresh = session_of(a)
    assert fresh is not None
    assert resumed < closed < events.index(("open", fresh))  # closed first, then the new one
    assert new.token > old.token
    assert cluster.ensemble.stat(a.znode() or "").ephemeralOwner == fresh


def test_after_a_partition_the_expired_sessions_znode_is_gone_before_the_new_one(
    cluster: Cluster,
) -> None:
    """The servers expired the session while the node was cut off: its znode went with it,
    so when the partition heals the node's new session queues without a stale znode of its
    own ahead of it."""
    a = cluster.node("a")
    old = wait_for("a leads", a.leading)
    b = cluster.node("b")
    wait_for("b queues", lambda: b.node.role == "follower" and b.znode())
    session = session_of(a)
    assert session is not None
    old_znode = a.znode()

    cluster.ensemble.partition()
    wait_loss_handled(a, 1)
    cluster.ensemble.expire_cut_off(session)
    cluster.ensemble.heal()

    wait_for("b leads", b.leading)
    fresh = wait_for(
        "a has a new session", lambda: (s := session_of(a)) not in (None, session) and s
    )
    events = cluster.ensemble.session_events
    assert events.index(("close", session)) < events.index(("open", fresh))
    assert old_znode is not None
    assert not cluster.ensemble.exists(old_znode)
    assert old.ended
    assert a.jobs.terms == [old]


# -- fatal errors ----------------------------------------------------------------------------


def test_a_layout_the_database_did_not_record_exits_with_code_78(cluster: Cluster) -> None:
    cluster.database.layout = {**DEFAULT_LAYOUT, "datacenter_id": 1}
    a = cluster.node("a")

    assert a.wait_exit() == EXIT_CONFIG
    assert a.store.outcomes() == ["layout_mismatch"]
    assert a.metric("allocator_layout_mismatch") == 1
    assert a.jobs.terms == []
    assert cluster.ensemble.children(ELECTION) == []
    assert cluster.database.history() == []


def test_a_layout_mismatch_met_by_the_jobs_exits_with_code_78(cluster: Cluster) -> None:
    a = cluster.node("a")
    term = wait_for("a leads", a.leading)

    a.jobs.report_fatal(LayoutMismatchError("AL104: the database recorded another layout"))

    assert a.wait_exit() == EXIT_CONFIG
    assert term.end_reason == "fatal"
    ended = cluster.database.term_of(term.token)
    assert ended is not None
    assert ended.end_reason == "fatal"
    assert a.metric("allocator_layout_mismatch") == 1
    assert cluster.ensemble.children(ELECTION) == []


def test_a_fenced_write_met_by_the_jobs_exits_with_code_4(cluster: Cluster) -> None:
    a = cluster.node("a")
    term = wait_for("a leads", a.leading)
    newer = Token(term.token.generation, term.token.epoch + 1)
    cluster.database.take_fence(newer, "intruder", "elsewhere", 1, DEFAULT_LAYOUT)

    a.jobs.report_fenced()

    assert a.wait_exit() == EXIT_FENCED
    assert term.end_reason == "fenced"
    assert not term.may_write()
    assert a.jobs.stops == 1
    assert cluster.database.fence().holder == "intruder"


# -- the schema revision (issue 25) ------------------------------------------------------------


def test_a_node_refuses_at_start_a_schema_older_than_it_can_use() -> None:
    ensemble = FakeEnsemble()
    node = bare_node(ensemble, {})
    node_store = node._store
    assert isinstance(node_store, FakeStore)
    node_store.schema = SchemaStamp("0009", "0003")

    with pytest.raises(SchemaMismatchError, match=r"revision 0009 is older.*allocator migrate"):
        node.run()
    assert SchemaMismatchError("").exit_code == EXIT_CONFIG
    assert ensemble.children("/") == []  # it never joined the election


def test_a_node_back_from_an_outage_to_a_schema_closed_to_it_stops_with_the_refusal(
    cluster: Cluster,
) -> None:
    a = cluster.node("a")
    term = wait_for("a leads", a.leading)
    a.store.reachable = False
    wait_for("a's probe fails", lambda: a.metric("allocator_database_reachable") == 0)
    # A failover or restore brings a schema a newer release closed to this one.
    a.store.schema = SchemaStamp("0015", "0014")
    a.store.reachable = True

    assert a.thread is not None
    a.thread.join(WAIT_S)
    assert not a.thread.is_alive()
    error, a.error = a.error, None  # seen here, not reported by the fixture
    assert isinstance(error, SchemaMismatchError)
    assert "revision 0015" in str(error)
    assert "upgrade the node to a release that knows revision 0014" in str(error)
    assert term.end_reason == "shutdown"  # handed over as on a SIGTERM
    assert cluster.ensemble.children(ELECTION) == []


def test_a_node_back_from_an_outage_to_a_schema_it_can_use_carries_on(cluster: Cluster) -> None:
    a = cluster.node("a")
    wait_for("a leads", a.leading)
    a.store.reachable = False
    wait_for("a's probe fails", lambda: a.metric("allocator_database_reachable") == 0)
    a.store.schema = SchemaStamp("0014", "0003")  # newer, expand-only
    a.store.reachable = True

    wait_for("a's probe answers", lambda: a.metric("allocator_database_reachable") == 1)
    assert a.leading() is not None
    assert a.thread is not None
    assert a.thread.is_alive()


# -- ZooKeeper ACLs (issue 10: must show 1 and 2) ---------------------------------------------


def bare_node(ensemble: FakeEnsemble, settings: Mapping[str, object]) -> Node:
    """A node on ``ensemble`` outside the ``cluster`` fixture, for runs that end by raising."""
    config = node_config("bare", settings)
    return Node(
        config,
        store=FakeStore(FakeDatabase(), available_blocks=FULL_POOL_BLOCKS),
        zookeeper=ClientFactory(
            ensemble,
            auth=config.zookeeper.auth.get_secret_value(),
            default_acl=zkclient.acl(config),
        ),
        jobs=FakeJobs(),
        health=NodeHealth(clock=FakeMonotonic()),
        pacing=FAST_PACING,
    )


def test_a_node_without_zookeeper_auth_refuses_to_start() -> None:
    ensemble = FakeEnsemble()
    node = bare_node(ensemble, {"zookeeper.auth": ""})

    with pytest.raises(ConfigError, match=r"zookeeper\.auth is not set.*zookeeper\.insecure"):
        node.run()
    assert ensemble.live_sessions() == set()
    assert ensemble.children("/") == []


def test_an_insecure_node_warns_at_start_and_runs(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="allocator.node")
    a = cluster.node("a", {"zookeeper.auth": "", "zookeeper.insecure": True})

    wait_for("a leads", a.leading)
    assert a.metric("allocator_zookeeper_insecure") == 1
    assert any("event=zookeeper_insecure" in r.getMessage() for r in caplog.records)
    znode = a.znode()
    assert znode is not None
    stranger = cluster.ensemble.client()  # the open ACL: anyone may write, as before ACLs
    stranger.start()
    try:
        stranger.set_async(znode, b"overwritten").get()
    finally:
        stranger.stop()
        stranger.close()


def test_a_nodes_znodes_carry_its_acl_and_a_stranger_can_do_nothing_to_them(
    cluster: Cluster,
) -> None:
    a = cluster.node("a")
    wait_for("a leads", a.leading)
    znode = a.znode()
    assert znode is not None
    assert a.metric("allocator_zookeeper_insecure") == 0
    ours = zkclient.acl(node_config("a", {}))
    assert ours is not None
    for path in (ELECTION, znode):
        acl, _stat = a.clients.latest.get_acls_async(path).get()
        assert zkclient.same_acl(acl, ours), path
    stranger = cluster.ensemble.client()
    stranger.start()
    try:
        for call in (
            lambda: stranger.create_async(f"{ELECTION}/n-{uuid.uuid4().hex}-", b"", sequence=True),
            lambda: stranger.set_async(znode, b"{}"),
            lambda: stranger.delete_async(znode),
            lambda: stranger.get_async(znode),
            lambda: stranger.get_children_async(ELECTION),
            lambda: stranger.set_acls_async(znode, []),
        ):
            with pytest.raises(NoAuthError):
                call().get()
    finally:
        stranger.stop()
        stranger.close()
    assert a.leading()


def test_a_node_takes_over_an_election_path_an_older_version_left_open(cluster: Cluster) -> None:
    cluster.ensemble.set_data(ELECTION, b"")  # open ACL, as every version before ACLs made it
    cluster.ensemble.set_data(fence.generation_path(ELECTION), b"0")
    a = cluster.node("a")
    wait_for("a leads", a.leading)

    ours = zkclient.acl(node_config("a", {}))
    assert ours is not None
    for path in (ELECTION, fence.generation_path(ELECTION)):
        acl, _stat = a.clients.latest.get_acls_async(path).get()
        assert zkclient.same_acl(acl, ours), path


def test_an_election_path_owned_by_another_identity_is_a_config_error() -> None:
    ensemble = FakeEnsemble()
    other = ensemble.client(auth="someone-else:theirs")
    other.start()
    other.ensure_path_async(
        ELECTION, acl=[make_digest_acl("someone-else", "theirs", all=True)]
    ).get()
    other.stop()
    node = bare_node(ensemble, {})

    with pytest.raises(ConfigError, match=r"refused access.*zookeeper\.auth"):
        node.run()
    assert ensemble.children(ELECTION) == []


def test_znodes_we_did_not_write_are_reported_and_change_no_place(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="allocator.node")
    a = cluster.node("a")
    term = wait_for("a leads", a.leading)
    # Junk an older version or a careless operator left, with the cluster's own identity:
    # a persistent lookalike, a foreign name, and an ephemeral entry holding garbage.
    cluster.ensemble.set_data(f"{ELECTION}/n-{uuid.uuid4().hex}-0000000000", b"{}")
    cluster.ensemble.set_data(f"{ELECTION}/lock", b"")
    squatter, junk = cluster.contender(fit("squatter"))
    squatter.set_async(junk, b"1e400").get()

    wait_for("reported", lambda: a.metric("allocator_election_unparsable_znodes") == 1)
    wait_for("ignored", lambda: a.metric("allocator_election_ignored_znodes") == 2)
    messages = [r.getMessage() for r in caplog.records]
    assert any("event=election_znodes_unparsable" in m and junk in m for m in messages)
    assert any("event=election_znodes_ignored" in m for m in messages)
    assert a.leading() is term  # nothing moved


# -- the session timeout the server grants ---------------------------------------------------


def test_a_node_times_its_self_stop_with_the_timeout_the_server_granted(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A server clamps the requested timeout (its min/maxSessionTimeout): asked for 20 s and
    granted 0.4 s, the node says so and its own timer declares a suspended session lost
    after 0.4 s, as the server does, not after 20 s (longer than this test waits)."""
    caplog.set_level(logging.WARNING, logger="allocator.node")
    cluster.ensemble.granted_timeout_ms = 400
    a = cluster.node(
        "a", {"zookeeper.session_timeout_ms": 20_000, "node.on_session_loss": "rejoin"}
    )
    old = wait_for("a leads", a.leading)
    assert a.metric("allocator_zookeeper_session_timeout_seconds") == 0.4
    warned = [r.getMessage() for r in caplog.records if "session_timeout_granted" in r.getMessage()]
    assert len(warned) == 1
    assert "configured_ms=20000" in warned[0]
    assert "granted_ms=400" in warned[0]

    cluster.ensemble.wipe()  # the old client stays suspended: only the node's timer ends it

    wait_for("a rejoins on a new client", lambda: len(a.clients.built) == 2)
    assert old.end_reason == "session_lost"
    assert any("suspended for 0.4 s" in r.getMessage() for r in caplog.records)

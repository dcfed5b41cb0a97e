"""Chaos: nodes' links to PostgreSQL black-holed (a TCP proxy that drops every packet).

Rules: one ZooKeeper server; the nodes run outside the supervisor (stopped by pid), each
with ``ALLOCATOR_POSTGRES_URL`` pointing at a proxy of its own in front of the cluster's
PostgreSQL (same node login role), or straight at it. Consumers claim through the consumer
URL directly, never through a proxy. Every test ends with the checker (I1-I5) finding
nothing.

A black hole is not a refusal: connections stay open, nothing is acknowledged, no FIN or
RST ever arrives (:meth:`allocator.drill.proxy.Proxy.blackhole`; the first test shows it). Only
the node's own bounds end its calls (TCP keepalives, ``tcp_user_timeout``, connect and pool
timeouts), so "nothing hangs" is what these tests are about. A node hangs if its admin
``/status`` does not answer within ``STATUS_TIMEOUT_S``: every wait during a cut polls the
``/status`` of every node first.

Timing contract (the product's, docs/design.md §11): a leader hands over after
``leader.db_unreachable_s`` without a successful write; a contender's advert of
``db_ok`` is at most about two ``leader.probe_interval_s`` old (an unanswered probe counts as
unreachable after one interval). Handing over only to contenders that really reach the
database needs the first to exceed the second plus the leader's write interval
(``pool.refill_interval_s``): 3 s against 2 x 0.5 s + 0.2 s here.
"""

from __future__ import annotations

import dataclasses
import errno
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pytest

from allocator.core.verify import check
from allocator.drill.proxy import Proxy
from allocator.local.tcp_ports import LOOPBACK
from allocator.zookeeper import client as zkclient
from allocator.zookeeper.election import Contender, read_contenders
from tests.chaos.harness import (
    ChaosCluster,
    Consumers,
    ExtraNode,
    Leader,
    chaos_consumers,
    http_json,
    layout,
    log_events,
    metric,
    now_utc,
    wait_for,
)

pytestmark = pytest.mark.integration

T = TypeVar("T")

DB_UNREACHABLE_S = 3
PROBE_INTERVAL_S = 0.5
POOL_BLOCKS = 1000
"""The pool the leader keeps (``pool.min_blocks``): at the consumers' pace (``PAUSE_S``,
about 80 blocks/s) it outlasts a handover or a cut of ten seconds."""
NODE_ENV = {
    "ALLOCATOR_LEADER_DB_UNREACHABLE_S": str(DB_UNREACHABLE_S),
    "ALLOCATOR_LEADER_PROBE_INTERVAL_S": str(PROBE_INTERVAL_S),
    "ALLOCATOR_POOL_MIN_BLOCKS": str(POOL_BLOCKS),
}
PAUSE_S = 0.05
CLAIMS = 20
STATUS_TIMEOUT_S = 1.0
"""A node's /status must answer within this on every poll, also while its database is cut
off (it reads nothing from the database)."""
NODE_NAMES = ("n1", "n2", "n3")
USER_TIMEOUT_MS = 200
"""``TCP_USER_TIMEOUT`` of the client sockets in the proxy's own test."""
ECHO_TIMEOUT_S = 2.0
FROZEN_WAIT_S = 5 * USER_TIMEOUT_MS / 1000
"""How long the proxy's test waits on a frozen link: longer than a black-holed connection
takes to give up (``USER_TIMEOUT_MS`` and the retransmission after it)."""


def proxied_url(url: str, proxy: Proxy) -> str:
    """``url`` with its host and port replaced by the proxy's (user, database kept)."""
    parts = urlsplit(url)
    user, at, _ = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user}{at}{proxy.address}"))


def status(node: ExtraNode) -> dict[str, Any]:
    """The node's /status; fails the test if it does not answer in time (a hung node)."""
    try:
        return http_json(f"{node.admin_url}/status", timeout_s=STATUS_TIMEOUT_S)
    except OSError as exc:
        raise AssertionError(f"{node.name}'s /status did not answer: {exc!r}") from exc


def withheld(node: ExtraNode) -> float | None:
    """The node's ``allocator_handover_withheld`` gauge."""
    return metric(node.admin_url, "allocator_handover_withheld", timeout_s=STATUS_TIMEOUT_S)


def responsive(nodes: Sequence[ExtraNode], condition: Callable[[], T]) -> Callable[[], T]:
    """``condition``, evaluated after every node's /status answered (a hung node fails)."""

    def polled() -> T:
        for node in nodes:
            status(node)
        return condition()

    return polled


def wait_advertising(node: ExtraNode, role: str, *, reachable: bool) -> None:
    """Until ``node`` is in ``role`` and advertises whether it reaches the database (and,
    when it does, that its clock agrees): the data a leader judges contenders by."""

    def advertised() -> bool:
        state = http_json(f"{node.admin_url}/status", timeout_s=STATUS_TIMEOUT_S)
        return (
            state["role"] == role
            and state["database_reachable"] is reachable
            and (state["clock_agrees"] is True or not reachable)
        )

    what = f"{node.name} to be {role}, advertising database reachable = {reachable}"
    wait_for(advertised, what, ignore=(OSError,))  # also while it starts


def advertises_unreachable(node: ExtraNode) -> Callable[[], bool]:
    return lambda: status(node)["database_reachable"] is False


@contextmanager
def running(consumers: Consumers) -> Iterator[Consumers]:
    """``consumers`` claiming until the block ends."""
    consumers.start()
    try:
        yield consumers
    finally:
        consumers.stop()


def contenders(chaos: ChaosCluster) -> list[Contender]:
    """The election as ``allocator status`` reads it (as the cluster's identity)."""
    info = chaos.info()
    client = zkclient.client_for(info.node_zk_hosts, info.zk_auth, timeout_s=10)
    client.start(timeout=10)
    try:
        return read_contenders(client, "/election")
    finally:
        client.stop()
        client.close()


def newer_leader(chaos: ChaosCluster, epoch: int) -> Leader | None:
    leader = chaos.leader()
    return leader if leader is not None and leader.epoch > epoch else None


# -- the proxy's black hole, on its own -------------------------------------------------------


@contextmanager
def echo_server() -> Iterator[int]:
    """A loopback TCP echo server (threads, stopped on exit); yields its port."""
    listener = socket.create_server((LOOPBACK, 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def echo(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.2)
            while not stop.is_set():
                try:
                    data = conn.recv(1024)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                conn.sendall(data)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    server = threading.Thread(target=serve, name="echo-server", daemon=True)
    server.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        server.join(2.0)
        listener.close()


def connect(proxy: Proxy, timeout_s: float = ECHO_TIMEOUT_S) -> socket.socket:
    sock = socket.create_connection((LOOPBACK, proxy.port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)
    return sock


def echoes(sock: socket.socket, data: bytes) -> bool:
    sock.sendall(data)
    return sock.recv(1024) == data


def test_blackhole_drops_packets_rather_than_refusing_or_closing() -> None:
    """Breaks: nothing of the allocator; shows what ``Proxy.blackhole`` does to TCP peers,
    against ``Proxy.freeze`` (a hung peer whose kernel still acknowledges).

    Must hold: black-holed, a connection that sends gets no reply, no FIN and no RST: its
    own TCP gives up (ETIMEDOUT from ``TCP_USER_TIMEOUT``: nothing it sent was acknowledged;
    the bound a node's libpq connections rely on); a quiet connection stays open; a new
    connection is not refused but times out (its SYN is never answered). Restored, the quiet
    connection carries data again and new ones connect. Frozen instead, the same send is
    acknowledged, so TCP never gives up: only the reader's own timeout ends the wait, and
    the data arrives once restored. Cost: ~2 s.
    """
    with echo_server() as port, Proxy(port) as proxy, ExitStack() as sockets:
        frozen, talker, quiet = (sockets.enter_context(connect(proxy)) for _ in range(3))
        assert all(echoes(sock, b"hello") for sock in (frozen, talker, quiet))

        proxy.freeze()
        frozen.sendall(b"ping")
        frozen.settimeout(FROZEN_WAIT_S)
        with pytest.raises(TimeoutError) as waited:
            frozen.recv(1024)
        assert waited.value.errno is None  # the socket's own timeout: TCP saw every ACK
        proxy.restore()
        assert frozen.recv(1024) == b"ping"  # held by the proxy, then delivered

        proxy.blackhole()
        assert proxy.is_blackholed
        talker.sendall(b"ping")
        with pytest.raises(TimeoutError) as dropped:
            talker.recv(1024)
        assert dropped.value.errno == errno.ETIMEDOUT  # TCP gave up: nothing acknowledged
        quiet.settimeout(USER_TIMEOUT_MS / 1000)
        with pytest.raises(TimeoutError) as silent:
            quiet.recv(1024)  # neither b"" (FIN) nor ConnectionResetError (RST)
        assert silent.value.errno is None
        with pytest.raises(TimeoutError) as unanswered:
            connect(proxy, timeout_s=USER_TIMEOUT_MS / 1000)  # not ConnectionRefusedError
        assert unanswered.value.errno is None

        proxy.restore()
        assert not proxy.is_blackholed
        quiet.settimeout(ECHO_TIMEOUT_S)
        assert echoes(quiet, b"again")
        assert echoes(sockets.enter_context(connect(proxy)), b"fresh")


# -- the allocator behind it -----------------------------------------------------------------


def test_leader_cut_off_from_postgres_hands_over_to_a_follower_that_reaches_it() -> None:
    """Breaks: the leader's link to PostgreSQL is black-holed; its follower's is not.

    Must hold: the leader's calls fail within its TCP bounds; ``leader.db_unreachable_s``
    after its last successful write it hands over, since the follower advertises a reachable
    database and an agreeing clock: the follower takes the fence with a newer epoch and
    cuts. The old leader leaves the election before any further database call (each would
    wait out the dead path's bounds), so the takeover ends its term as ``superseded``; its
    log gives ``db_unreachable``.
    Nothing hangs: the old leader's /status answers throughout, it stays up, queues as a
    follower and reaches the database again once the link is back. Consumers (direct) claim
    throughout; no violation, and the checker would see one had a write of the old epoch
    landed after the takeover. Cost: ~14 s.
    """
    with ChaosCluster(zk=1, nodes=0, node_env=NODE_ENV) as chaos:
        info = chaos.info()
        with Proxy(info.postgres.port) as proxy:
            cutoff = chaos.start_extra_node(
                "cutoff", database_url=proxied_url(info.node_database_url, proxy)
            )
            old = chaos.wait_leader()
            assert old.name == "cutoff"
            direct = chaos.start_extra_node("direct")
            wait_advertising(direct, "follower", reachable=True)
            chaos.wait_pool(POOL_BLOCKS)
            consumers = chaos_consumers(chaos.info().consumer_database_url, pause_s=PAUSE_S).start()
            try:
                wait_for(lambda: consumers.count() >= CLAIMS, "claims before the cut")
                proxy.blackhole()
                cut_at, cut_started = now_utc(), time.monotonic()
                new = wait_for(
                    responsive([cutoff, direct], lambda: newer_leader(chaos, old.epoch)),
                    "the follower to take over",
                )
                handover_s = time.monotonic() - cut_started
                assert new.name == "direct"
                wait_for(
                    responsive([cutoff, direct], lambda: chaos.blocks_cut(epoch=new.epoch)),
                    "the new leader to cut",
                )
                wait_for(
                    responsive([cutoff], lambda: status(cutoff)["role"] == "follower"),
                    "the old leader to queue as a follower",
                )
                assert consumers.count(since=cut_at.timestamp()) >= CLAIMS
                assert proxy.is_blackholed
                proxy.restore()
                wait_advertising(cutoff, "follower", reachable=True)
                records = chaos.assert_clean(consumers)
            finally:
                consumers.stop()
            assert cutoff.exit_code is None
        term = next(t for t in chaos.history() if t.epoch == old.epoch)
        assert term.end_reason == "superseded"
        assert any(
            "reason=db_unreachable" in line for line in log_events(cutoff.log_path, "stepped_down")
        )
        # It left the election first and never waited on the dead path to end its term.
        assert not log_events(cutoff.log_path, "end_term_failed")
        # The checker is not blind here: a block of the old epoch after the new leader's last
        # one (a write of the cut-off leader landing after the takeover, and after the new
        # leader wrote) is caught.
        ledger = chaos.ledger()
        newest = max(ledger, key=lambda row: row.first_id)
        assert newest.epoch == new.epoch
        size = newest.last_id - newest.first_id + 1
        late = dataclasses.replace(
            newest,
            block_id=max(row.block_id for row in ledger) + 1,
            first_id=newest.last_id + 1,
            last_id=newest.last_id + size,
            epoch=old.epoch,
            claimed_by=None,
            claimed_at=None,
        )
        forged = [*ledger, late]
        violations = check(records, forged, chaos.history(), layout(), chaos.writes())
        assert any(v.invariant == "I3" and "stale write" in v.message for v in violations), (
            violations
        )
        print(f"handover: the follower held the fence {handover_s:.1f} s after the cut")


def test_every_node_cut_off_from_postgres_keeps_its_leader_and_recovers() -> None:
    """Breaks: every node's link to PostgreSQL is black-holed at once (consumers' is not);
    then the leader's link comes back, then the others'.

    Must hold: no churn: the leader's writes fail, but no contender advertises a reachable
    database, so it keeps the fence (same token, no new term) and reports the handover as
    withheld (``allocator_handover_withheld`` 1, /status ``handover_withheld``); every
    node's /status answers throughout; consumers keep claiming from the pool. Once its link
    is back the same leader cuts again and clears the report; once all are back it refills
    the pool, and there still was only the one term; no violation. Cost: ~20 s.

    (The leader's link comes back first on purpose: when all come back at once, a follower
    that reaches the database before the leader writes again may be handed the lead, as the
    rule says; that is one handover after the fault, not churn during it.)
    """
    with ChaosCluster(zk=1, nodes=0, node_env=NODE_ENV) as chaos, ExitStack() as stack:
        info = chaos.info()
        proxies: dict[str, Proxy] = {}
        nodes: list[ExtraNode] = []
        for name in NODE_NAMES:
            proxies[name] = stack.enter_context(Proxy(info.postgres.port))
            url = proxied_url(info.node_database_url, proxies[name])
            nodes.append(chaos.start_extra_node(name, database_url=url))
        leader = chaos.wait_leader()
        first = next(node for node in nodes if node.name == leader.name)
        followers = [node for node in nodes if node is not first]
        for node in followers:
            wait_advertising(node, "follower", reachable=True)
        chaos.wait_pool(POOL_BLOCKS)
        terms = chaos.history()
        consumers = chaos_consumers(chaos.info().consumer_database_url, pause_s=PAUSE_S).start()
        try:
            wait_for(lambda: consumers.count() >= CLAIMS, "claims before the cut")
            for proxy in proxies.values():
                proxy.blackhole()
            cut_started = time.monotonic()
            wait_for(
                responsive(nodes, lambda: withheld(first) == 1),
                "the leader to withhold its handover",
            )
            withheld_s = time.monotonic() - cut_started
            assert status(first)["handover_withheld"] == "db_unreachable"
            tries = len(log_events(first.log_path, "refill_failed"))
            for node in followers:
                wait_for(
                    responsive(nodes, advertises_unreachable(node)),
                    f"{node.name} to advertise that it cannot reach the database",
                )
            claimed = time.time()
            wait_for(
                responsive(nodes, lambda: consumers.count(since=claimed) >= CLAIMS),
                "claims from the pool while every node is cut off",
            )
            wait_for(  # the try in flight, then a whole one (a pool timeout) after the verdict
                responsive(
                    nodes, lambda: len(log_events(first.log_path, "refill_failed")) > tries + 1
                ),
                "the leader to try (and fail) to refill twice more, still leading",
            )
            assert withheld(first) == 1
            assert chaos.fence() == (leader.epoch, leader.name)
            assert chaos.history() == terms
            assert [status(node)["role"] for node in nodes] == [
                "leader" if node is first else "follower" for node in nodes
            ]
            assert all(proxy.is_blackholed for proxy in proxies.values())

            restored_at = now_utc()
            proxies[first.name].restore()
            wait_for(
                responsive(nodes, lambda: chaos.blocks_cut(epoch=leader.epoch, after=restored_at)),
                "the leader to cut again",
            )
            recovered_s = (now_utc() - restored_at).total_seconds()
            wait_for(responsive(nodes, lambda: withheld(first) == 0), "the report to clear")
            for proxy in proxies.values():
                proxy.restore()
            for node in followers:
                wait_advertising(node, "follower", reachable=True)
            records = chaos.assert_clean(consumers)
        finally:
            consumers.stop()
        chaos.wait_pool(POOL_BLOCKS)  # refilled, now that nobody claims
        assert not chaos.check(records)
        assert chaos.fence() == (leader.epoch, leader.name)
        assert chaos.history() == terms
        assert all(node.exit_code is None for node in nodes)
        assert log_events(first.log_path, "handover_withheld")
        assert not log_events(first.log_path, "handing_over")
        print(f"withheld {withheld_s:.1f} s after the cut, cutting {recovered_s:.1f} s after it")


def test_a_contender_cut_off_from_postgres_never_holds_up_the_election() -> None:
    """Breaks: the link to PostgreSQL of B, queued second, is black-holed; C queues behind
    it; the leader A stops gracefully (SIGTERM), then C too.

    Must hold (issue 19, item 1): B, first in the queue after A, makes way at once for C,
    which advertises a reachable database: C takes the fence and cuts. With C gone too and
    nobody fit behind it, B stays first (no churn) and says why: role ``blocked``, reason
    ``database_unreachable`` in /status, its advert (``allocator status``) and the metric
    ``allocator_blocked``; once its link is back it leads and cuts. Before, B paused and
    retried the watermark check on its dead link for as long as the link was down, holding
    the lead with nothing cut. Cost: ~20 s.
    """
    with ChaosCluster(zk=1, nodes=0, node_env=NODE_ENV) as chaos, ExitStack() as stack:
        info = chaos.info()
        with Proxy(info.postgres.port) as proxy:
            a = chaos.start_extra_node("a")
            first = chaos.wait_leader()
            assert first.name == "a"
            consumers = stack.enter_context(
                running(chaos_consumers(info.consumer_database_url, pause_s=PAUSE_S))
            )
            b = chaos.start_extra_node("b", database_url=proxied_url(info.node_database_url, proxy))
            wait_advertising(b, "follower", reachable=True)
            proxy.blackhole()
            wait_for(responsive([a, b], advertises_unreachable(b)), "b to advertise no database")
            c = chaos.start_extra_node("c")
            wait_advertising(c, "follower", reachable=True)

            stopped = time.monotonic()
            assert a.stop() == 0
            new = wait_for(
                responsive([b, c], lambda: newer_leader(chaos, first.epoch)), "a new leader"
            )
            assert new.name == "c"
            wait_for(responsive([b, c], lambda: chaos.blocks_cut(epoch=new.epoch)), "c to cut")
            handover_s = time.monotonic() - stopped
            assert status(b)["role"] == "follower"
            assert log_events(b.log_path, "making_way")

            assert c.stop() == 0
            blocked = wait_for(
                responsive([b], lambda: (s := status(b))["role"] == "blocked" and s),
                "b to report itself blocked",
            )
            assert blocked["blocked"]["reason"] == "database_unreachable"
            blocked_metric = 'allocator_blocked{reason="database_unreachable"}'
            assert metric(b.admin_url, blocked_metric, timeout_s=STATUS_TIMEOUT_S) == 1
            wait_for(  # what `allocator status` shows: the advert in b's znode
                lambda: [c.identity.blocked for c in contenders(chaos)] == ["database_unreachable"],
                "b to advertise why it is blocked",
            )
            assert chaos.fence() == (new.epoch, "c")  # nobody took the fence meanwhile

            proxy.restore()
            wait_advertising(b, "leader", reachable=True)
            taken = chaos.wait_leader(newer_than=new.epoch)
            assert taken.name == "b"
            wait_for(lambda: chaos.blocks_cut(epoch=taken.epoch), "b to cut")
            assert status(b)["blocked"] is None
            chaos.assert_clean(consumers)
        print(f"handover past the cut-off contender: c cut {handover_s:.1f} s after a stopped")

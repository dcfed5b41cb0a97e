"""Chaos: one node's link to ZooKeeper is cut (a TCP proxy), shorter and longer than its session.

Rules: one ZooKeeper server (the proxy fronts it), a session timeout of 3000 ms; the node
under test runs outside the supervisor (``ALLOCATOR_ZOOKEEPER_HOSTS`` points at the proxy,
with the cluster's chroot) and is stopped by pid; one supervised node is its rival. Every
test ends with the checker (I1-I5) finding nothing.

A cut resets both sides of every live connection at once, so the node sees the break
within milliseconds. ``NOTICE_S`` is the grace allowed between the cut and the node seeing
it: a block whose statement began in that instant could still commit (its commit-time
check ran before the node knew). No block may start after it while the link is down.
"""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest
from kazoo.recipe.watchers import ChildrenWatch

from allocator.drill.proxy import Proxy
from allocator.node import EXIT_FENCED, EXIT_SESSION_LOST
from allocator.zookeeper import client as zkclient
from tests.chaos.harness import (
    ChaosCluster,
    ExtraNode,
    chaos_consumers,
    eventually,
    http_json,
    log_events,
    now_utc,
    wait_for,
)

pytestmark = pytest.mark.integration

SESSION_TIMEOUT_MS = 3000
SHORT_CUT_S = SESSION_TIMEOUT_MS / 1000 / 4
NOTICE_S = 0.2
CLAIMS = 20
ELECTION = "/election"


EXIT_ON_LOSS = {"ALLOCATOR_NODE_ON_SESSION_LOSS": "exit"}
"""These tests prove the exit path (the supervisor restarts the node); rejoin is the default."""


def proxied_hosts(chaos: ChaosCluster, proxy: Proxy) -> str:
    """The proxy's address with the cluster's chroot, as the node's ZooKeeper hosts."""
    info = chaos.info()
    return proxy.address + info.node_zk_hosts.removeprefix(info.zk_hosts)


def status(node: ExtraNode) -> dict[str, object]:
    return http_json(f"{node.admin_url}/status")


def test_zookeeper_link_cut_shorter_than_the_session_keeps_the_same_leader() -> None:
    """Breaks: the leader's connection to ZooKeeper, for a quarter of its session timeout.

    Must hold: the leader stops writing at once (SUSPENDED: ``may_write`` false), writes
    nothing while cut off, reconnects to the same session, re-checks its znode and resumes
    with the same epoch (no handover, one term in the history); it cuts again after the
    link is back; no violation. Cost: ~5 s.
    """
    with ChaosCluster(zk=1, nodes=0, session_timeout_ms=SESSION_TIMEOUT_MS) as chaos:
        with Proxy(chaos.info().zk_servers[0].client_port) as proxy:
            node = chaos.start_extra_node("proxied", zk_hosts=proxied_hosts(chaos, proxy))
            old = chaos.wait_leader()
            assert old.name == "proxied"
            rival = chaos.up(nodes=1).nodes[0]
            chaos.wait_role(rival.admin_url, "follower", "the rival to queue")
            consumers = chaos_consumers(chaos.info().consumer_database_url).start()
            try:
                wait_for(lambda: consumers.count() >= CLAIMS, "claims before the cut")
                proxy.cut()
                cut_at, cut_started = now_utc(), time.monotonic()
                wait_for(
                    lambda: (s := status(node))["session"] == "suspended" and not s["may_write"],
                    "the leader to stop writing",
                )
                # The fault's length (not a wait for state): a quarter of the session.
                time.sleep(max(0.0, SHORT_CUT_S - (time.monotonic() - cut_started)))
                restored_at = now_utc()
                proxy.restore()
                wait_for(
                    lambda: (s := status(node))["session"] == "connected" and s["may_write"],
                    "the leader to resume",
                )
                assert chaos.fence() == (old.epoch, "proxied")
                chaos.wait_cutting(old.epoch, after=restored_at)
                chaos.assert_clean(consumers)
            finally:
                consumers.stop()
            assert [t.epoch for t in chaos.history()] == [old.epoch]
            assert log_events(node.log_path, "session_suspended")
            assert log_events(node.log_path, "resumed")
            assert node.stop() == 0
        quiet_from = cut_at + timedelta(seconds=NOTICE_S)
        written = [r for r in chaos.ledger() if quiet_from <= r.cut_at < restored_at]
        assert not written, f"{len(written)} blocks cut while the link was down: {written[0]}"


def test_zookeeper_link_cut_longer_than_the_session_hands_over() -> None:
    """Breaks: the leader's connection to ZooKeeper, until well past its session timeout.

    Must hold: the leader stops writing at once, declares its session lost by its own timer
    while still cut off (kazoo alone would stay SUSPENDED) and exits 3; its session expires
    on the server, so the rival takes over with a newer epoch and cuts; the old epoch cuts
    nothing after the cut; no violation. Cost: ~7 s.
    """
    with ChaosCluster(zk=1, nodes=0, session_timeout_ms=SESSION_TIMEOUT_MS) as chaos:
        with Proxy(chaos.info().zk_servers[0].client_port) as proxy:
            node = chaos.start_extra_node(
                "proxied", EXIT_ON_LOSS, zk_hosts=proxied_hosts(chaos, proxy)
            )
            old = chaos.wait_leader()
            assert old.name == "proxied"
            rival = chaos.up(nodes=1).nodes[0]
            chaos.wait_role(rival.admin_url, "follower", "the rival to queue")
            consumers = chaos_consumers(chaos.info().consumer_database_url).start()
            try:
                wait_for(lambda: consumers.count() >= CLAIMS, "claims before the cut")
                proxy.cut()
                cut_at = now_utc()
                wait_for(lambda: node.exit_code is not None, "the cut-off leader to stop itself")
                assert node.exit_code == EXIT_SESSION_LOST
                assert proxy.is_cut
                new = chaos.wait_leader(newer_than=old.epoch)
                assert new.name == rival.name
                proxy.restore()
                chaos.wait_cutting(new.epoch, after=cut_at)
                chaos.assert_clean(consumers)
            finally:
                consumers.stop()
        assert log_events(node.log_path, "session_lost")
        late = chaos.blocks_cut(epoch=old.epoch, after=cut_at + timedelta(seconds=NOTICE_S))
        assert late == 0


def test_a_leader_cut_off_past_the_session_rejoins_without_a_stale_znode() -> None:
    """Breaks: the leader's connection to ZooKeeper, past its session timeout (rejoin, the
    default), then the link comes back.

    Must hold: the leader's term ends by its own timer while cut off, the process does not
    exit; the rival takes over with a newer epoch; once the link heals the node gets a new
    session (the servers expired the old one), and the election never holds its old znode
    and its new one at once (watched from outside: the stale znode is gone before the new
    one is created, no session timeout of waiting); it queues behind the rival; the old
    epoch cuts nothing after the cut; no violation. Cost: ~8 s.
    """
    with ChaosCluster(zk=1, nodes=0, session_timeout_ms=SESSION_TIMEOUT_MS) as chaos:
        info = chaos.info()
        watcher = zkclient.client_for(info.node_zk_hosts, info.zk_auth, timeout_s=10.0)
        watcher.start(timeout=10.0)
        with Proxy(info.zk_servers[0].client_port) as proxy:
            node = chaos.start_extra_node("proxied", zk_hosts=proxied_hosts(chaos, proxy))
            old = chaos.wait_leader()
            assert old.name == "proxied"
            old_status = status(node)
            rival = chaos.up(nodes=1).nodes[0]
            chaos.wait_role(rival.admin_url, "follower", "the rival to queue")
            seen: list[set[str]] = []
            ChildrenWatch(watcher, ELECTION, lambda children: seen.append(set(children)))
            consumers = chaos_consumers(info.consumer_database_url).start()
            try:
                wait_for(lambda: consumers.count() >= CLAIMS, "claims before the cut")
                proxy.cut()
                cut_at = now_utc()
                new = chaos.wait_leader(newer_than=old.epoch)
                assert new.name == rival.name
                wait_for(lambda: status(node)["role"] == "follower", "the term to end, cut off")
                assert proxy.is_cut
                proxy.restore()
                rejoined = wait_for(
                    lambda: (
                        (s := status(node))["session_id"] not in (None, old_status["session_id"])
                        and s["znode"]
                        and s
                    ),
                    "the node back with a new session and znode",
                )
                assert node.exit_code is None
                chaos.wait_cutting(new.epoch, after=cut_at)
                chaos.assert_clean(consumers)
            finally:
                consumers.stop()
                watcher.stop()
                watcher.close()
        old_name = str(old_status["znode"]).rsplit("/", 1)[1]
        new_name = str(rejoined["znode"]).rsplit("/", 1)[1]
        assert any(new_name in children for children in seen)
        assert not any({old_name, new_name} <= children for children in seen)
        assert log_events(node.log_path, "session_rejoined")
        late = chaos.blocks_cut(epoch=old.epoch, after=cut_at + timedelta(seconds=NOTICE_S))
        assert late == 0


def test_leader_paused_behind_a_silent_partition_is_fenced_by_postgres() -> None:
    """Breaks: the leader freezes (SIGSTOP) past its session timeout and, meanwhile, its
    ZooKeeper link goes silent (a frozen proxy: no data, no reset). When it runs on
    (SIGCONT) nothing tells it yet that it lost: kazoo needs a missed heartbeat (~1 s).

    Must hold: the rival takes over with a newer epoch; the resumed leader's next write is
    rejected by PostgreSQL (AL100: ``fenced_write_rejected``) and it exits 4; nothing of its
    epoch commits after its term ended; no violation. This is the fence doing the work that
    ZooKeeper cannot do in time. Cost: ~7 s.
    """
    with ChaosCluster(zk=1, nodes=0, session_timeout_ms=SESSION_TIMEOUT_MS) as chaos:
        with Proxy(chaos.info().zk_servers[0].client_port) as proxy:
            node = chaos.start_extra_node(
                "proxied", EXIT_ON_LOSS, zk_hosts=proxied_hosts(chaos, proxy)
            )
            old = chaos.wait_leader()
            assert old.name == "proxied"
            rival = chaos.up(nodes=1).nodes[0]
            chaos.wait_role(rival.admin_url, "follower", "the rival to queue")
            consumers = chaos_consumers(chaos.info().consumer_database_url).start()
            try:
                wait_for(lambda: consumers.count() >= CLAIMS, "claims before the fault")
                node.signal(signal.SIGSTOP)
                paused_at = now_utc()
                proxy.freeze()
                new = chaos.wait_leader(newer_than=old.epoch)
                assert new.name == rival.name
                node.signal(signal.SIGCONT)
                wait_for(lambda: node.exit_code is not None, "the stale leader to exit")
                assert node.exit_code == EXIT_FENCED
                proxy.restore()
                chaos.wait_cutting(new.epoch, after=paused_at)
                chaos.assert_clean(consumers)
            finally:
                consumers.stop()
        assert log_events(node.log_path, "fenced_write_rejected")
        ended = next(t.ended_at for t in chaos.history() if t.epoch == old.epoch)
        assert ended is not None
        assert chaos.blocks_cut(epoch=old.epoch, after=ended) == 0


def test_a_follower_cut_off_longer_than_the_session_stops_itself() -> None:
    """Breaks: a follower's connection to ZooKeeper, for longer than its session timeout.

    Must hold (docs/design.md §4: "if not reconnected within the session timeout, treat it as
    LOST"; "followers behave the same"): the follower exits 3 by its own timer while the
    link is still down. (It once did not: its ZooKeeper calls waited for the reconnect, so
    the timer never ran; every election call is now bounded.) Cost: ~5 s.
    """
    with ChaosCluster(zk=1, nodes=1, session_timeout_ms=SESSION_TIMEOUT_MS) as chaos:
        chaos.wait_leader()
        with Proxy(chaos.info().zk_servers[0].client_port) as proxy:
            node = chaos.start_extra_node(
                "proxied", EXIT_ON_LOSS, zk_hosts=proxied_hosts(chaos, proxy)
            )
            chaos.wait_role(node.admin_url, "follower", "the proxied node to queue")
            proxy.cut()
            try:
                stopped_while_cut = eventually(
                    lambda: node.exit_code is not None, 2 * SESSION_TIMEOUT_MS / 1000 + 2
                )
            finally:
                # A node that did not stop reaches ZooKeeper again, learns its session
                # expired and exits; until then it would not even obey SIGTERM (same bug).
                proxy.restore()
                wait_for(lambda: node.exit_code is not None, "the follower to exit at last")
            assert stopped_while_cut, "the follower was still running, cut off, 2 sessions on"
            assert node.exit_code == EXIT_SESSION_LOST

"""Every fault the drill rehearses, as a :class:`Scenario`: what it needs, what it does, how it
heals. Faults act only through real mechanisms: the cluster manager's signals and server
stops, a second client closing the leader's ZooKeeper session with the credentials of its
session file (:func:`allocator.session.reaper.close_session`), the drill's proxies, libfaketime.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from allocator.core import logs
from allocator.drill.links import Links
from allocator.drill.observe import DrillError, Leader, request_step_down
from allocator.drill.results import RoundResult
from allocator.local.cluster import LocalCluster
from allocator.session import file as session_file
from allocator.session import reaper

log = logs.get_logger(__name__)

# The capabilities a scenario may need: the nodes' processes, their session files, the
# ZooKeeper servers, PostgreSQL, a standby, LINKS (the nodes reach ZooKeeper and PostgreSQL
# through the drill's proxies and start under its shim) and the admin token.
SIGNALS: Final = "signals"
SESSIONS: Final = "sessions"
ZK_SERVERS: Final = "zk-servers"
POSTGRES: Final = "postgres"
STANDBY: Final = "standby"
LINKS: Final = "links"
STEP_DOWN: Final = "step-down"

CLOCK_AHEAD_OFFSET: Final = "+1h"
CLOCK_BEHIND_OFFSET: Final = "-1m"
EXPIRE_CONNECT_TIMEOUT_S: Final = 5.0
PG_RESTART_DOWN_S: Final = 1.0
HANDOVER_TIMEOUT_FACTOR: Final = 3
HANDOVER_TIMEOUT_MARGIN_S: Final = 10.0
LEADERLESS_MARGIN_S: Final = 2.0
"""How much longer than its outage a fault that nodes ride out may leave the cluster
without a serving leader (reconnect, takeover, the timeline's 0.5 s samples)."""
DEFAULT_DB_UNREACHABLE_S: Final = 15.0
DEFAULT_CLOCK_SKEW_HANDOVER_S: Final = 10.0


@dataclass
class Target:
    """What the faults act on; ``local`` None is a deployed cluster (no process control)."""

    names: list[str]
    admin_urls: dict[str, str]
    admin_token: str
    session_timeout_ms: int
    zk_hosts: str
    """The nodes' ZooKeeper connect string (the drill's own client uses it too)."""
    local: LocalCluster | None = None
    links: Links | None = None
    node_state_dirs: dict[str, Path] = field(default_factory=dict)
    zk_server_ids: list[int] = field(default_factory=list)
    has_standby: bool = False
    db_unreachable_s: float = DEFAULT_DB_UNREACHABLE_S
    clock_skew_handover_s: float = DEFAULT_CLOCK_SKEW_HANDOVER_S
    rng: random.Random = field(default_factory=random.Random)

    @property
    def session_s(self) -> float:
        """The session timeout in seconds; fault durations derive from it (a short cut lasts
        a third of it, a long cut and a pause twice it, quorum loss one and a half)."""
        return self.session_timeout_ms / 1000

    def capabilities(self) -> frozenset[str]:
        """What this target lets a fault do (:data:`SIGNALS`, :data:`LINKS`, ...)."""
        found = {STEP_DOWN} if self.admin_token else set()
        if self.local is not None:
            found |= {SIGNALS, ZK_SERVERS, POSTGRES}
            if self.node_state_dirs:
                found.add(SESSIONS)
            if self.has_standby:
                found.add(STANDBY)
        if self.links is not None:
            found.add(LINKS)
        return frozenset(found)

    def cluster(self) -> LocalCluster:
        """The local cluster, or DrillError for a deployed one."""
        if self.local is None:
            raise DrillError("this fault needs process control of the cluster")
        return self.local

    def node_links(self) -> Links:
        """The drill's links, or DrillError when the nodes run without them."""
        if self.links is None:
            raise DrillError("this fault needs the drill's links to the nodes")
        return self.links


@dataclass
class Fault:
    """What ``inject`` applied: what it hit, the moment handover time counts from, and how
    and when to heal it."""

    scenario: str
    target: str | None
    started_at: float
    """Monotonic time handover is measured from (the fault, or a skewed node's takeover)."""
    heal: Callable[[], None] | None = None
    heal_at: float | None = None
    """When to heal (monotonic); None with ``heal``: once handed over or past the deadline."""
    healed_at: float | None = None
    heal_returned_at: float | None = None
    """When ``heal`` returned (a restarted server serves again then)."""
    away_from: Leader | None = None
    """The term the handover leaves (None: the leader the round started with)."""

    @property
    def healed(self) -> bool:
        """Nothing to heal, or healed already."""
        return self.heal is None or self.healed_at is not None


class Waits:
    """What a blocking ``inject`` may wait for (the runner provides it)."""

    def wait_ready(self) -> Leader:
        """Until the cluster is ready for a round; its leader."""
        raise NotImplementedError

    def wait_newer(self, than: Leader) -> Leader:
        """Until the fence shows a newer epoch than ``than``'s, held by another node."""
        raise NotImplementedError

    def wait_restarted(self, name: str, old_pid: int) -> None:
        """Until node ``name`` runs again with a pid other than ``old_pid``."""
        raise NotImplementedError


Inject = Callable[[Target, Leader, Waits], Fault]


@dataclass(frozen=True)
class Scenario:
    """One fault: the capabilities it ``needs`` and its ``inject``.

    ``inject`` applies the fault to a ready cluster and returns at once with a
    :class:`Fault`; only the clock scenarios block in it (they first make the skewed node
    lead: restart it under libfaketime, then step down the nodes ahead of it).
    ``must_hand_over``: the fault takes the leader out (its process, session or links), so a
    newer epoch held by another node must follow within :meth:`handover_timeout_s`; the
    others (a short ZooKeeper cut, one ZooKeeper server, quorum, PostgreSQL restart or
    failover) *may* hand over, and a round of theirs is judged by recovery and the checker.
    """

    name: str
    needs: frozenset[str]
    must_hand_over: bool
    inject: Inject
    extra_timeout_s: Callable[[Target], float] = lambda _target: 0.0
    """Added to the handover deadline (a fault whose detection has its own delay)."""
    rides_out: bool = False
    """Judged by its outage (a round of it alone): no node process may restart, and the
    cluster may be without a serving leader at most the outage plus
    :data:`LEADERLESS_MARGIN_S` (an outage that ends without restarts, docs/design.md §4)."""

    def judge(self, outcome: RoundResult) -> str | None:
        """Why a round of this scenario alone failed its own bounds; None if it did not."""
        if not self.rides_out:
            return None
        if outcome.node_restarts:
            return f"{outcome.node_restarts} node process(es) restarted; {self.name} must not"
        if outcome.outage_s is None or outcome.leaderless_s is None:
            return None
        bound_s = outcome.outage_s + LEADERLESS_MARGIN_S
        if outcome.leaderless_s > bound_s:
            return (
                f"no leader for {outcome.leaderless_s:.1f} s, over the outage "
                f"({outcome.outage_s:.1f} s) plus {LEADERLESS_MARGIN_S:.0f} s"
            )
        return None

    def handover_timeout_s(self, target: Target) -> float:
        """How long a required handover may take on ``target``."""
        base = HANDOVER_TIMEOUT_FACTOR * target.session_s + HANDOVER_TIMEOUT_MARGIN_S
        return base + self.extra_timeout_s(target)


# -- node processes ---------------------------------------------------------------------------


def _signal(name: str, sig: str) -> Inject:
    def inject(target: Target, leader: Leader, _waits: Waits) -> Fault:
        started = time.monotonic()
        target.cluster().signal_node(leader.name, sig)
        return Fault(name, leader.name, started)

    return inject


def _step_down(target: Target, leader: Leader, _waits: Waits) -> Fault:
    started = time.monotonic()
    request_step_down(leader.admin_url, target.admin_token)
    return Fault("step-down", leader.name, started)


def _pause(target: Target, leader: Leader, _waits: Waits) -> Fault:
    cluster = target.cluster()
    started = time.monotonic()
    cluster.signal_node(leader.name, "SIGSTOP")
    return Fault(
        "pause",
        leader.name,
        started,
        heal=lambda: _signal_if_running(cluster, leader.name, "SIGCONT"),
        heal_at=started + 2 * target.session_s,
    )


def _signal_if_running(cluster: LocalCluster, name: str, sig: str) -> None:
    """Send ``sig`` to node ``name`` unless it has gone (restarted meanwhile: nothing to
    heal)."""
    try:
        cluster.signal_node(name, sig)
    except Exception as exc:
        log.info("signal_skipped", node=name, signal=sig, error=str(exc))


def _host_death(target: Target, leader: Leader, _waits: Waits) -> Fault:
    """SIGSTOP, never resumed: once someone else leads, the frozen process is killed (the
    host "comes back" rebooted) so the next round has every node again."""
    cluster = target.cluster()
    started = time.monotonic()
    cluster.signal_node(leader.name, "SIGSTOP")
    return Fault(
        "host-death",
        leader.name,
        started,
        heal=lambda: _signal_if_running(cluster, leader.name, "SIGKILL"),
    )


def _expire(target: Target, leader: Leader, _waits: Waits) -> Fault:
    state_dir = target.node_state_dirs.get(leader.name)
    record = session_file.read(state_dir) if state_dir is not None else None
    if record is None or record.pid != leader.pid:
        raise DrillError(f"{leader.name} has no session file of pid {leader.pid}")
    started = time.monotonic()
    try:
        reaper.close_session(
            target.zk_hosts, (record.session_id, record.session_password), EXPIRE_CONNECT_TIMEOUT_S
        )
    except (KazooException, KazooTimeoutError) as exc:
        log.info("session_close_retry", error=str(exc))  # the owner won the race
    return Fault("expire", leader.name, started)


# -- links ------------------------------------------------------------------------------------


def _zk_cut(name: str, factor: float) -> Inject:
    def inject(target: Target, leader: Leader, _waits: Waits) -> Fault:
        links = target.node_links()
        started = time.monotonic()
        links.blackhole_zookeeper(leader.name)
        return Fault(
            name,
            leader.name,
            started,
            heal=lambda: links.heal(leader.name),
            heal_at=started + factor * target.session_s,
        )

    return inject


def _pg_partition(target: Target, leader: Leader, _waits: Waits) -> Fault:
    links = target.node_links()
    started = time.monotonic()
    links.blackhole_postgres(leader.name)
    return Fault("pg-partition", leader.name, started, heal=lambda: links.heal(leader.name))


def _clock(name: str, offset: str) -> Inject:
    def inject(target: Target, leader: Leader, waits: Waits) -> Fault:
        """Restart the leader under a skewed clock, make it lead again (step down the nodes
        ahead of it), and measure how long it takes to hand over to a node whose clock
        agrees with the database."""
        cluster, links = target.cluster(), target.node_links()
        links.set_clock(leader.name, offset)
        cluster.signal_node(leader.name, "SIGTERM")  # it hands over and restarts skewed
        waits.wait_restarted(leader.name, leader.pid)
        current = waits.wait_ready()
        for _ in range(len(target.names)):
            if current.name == leader.name:
                break
            request_step_down(current.admin_url, target.admin_token)
            successor = waits.wait_newer(current)
            if successor.name == leader.name:
                current = successor
                break
            current = waits.wait_ready()
        else:
            raise DrillError(f"{leader.name} never led again after its restart")
        started = time.monotonic()

        def heal() -> None:
            links.set_clock(leader.name, None)
            cluster.signal_node(leader.name, "SIGTERM")  # a follower by now: no handover
            waits.wait_restarted(leader.name, current.pid)

        return Fault(name, leader.name, started, heal=heal, away_from=current)

    return inject


# -- servers ----------------------------------------------------------------------------------


def _zk_server_kill(target: Target, leader: Leader, _waits: Waits) -> Fault:
    cluster = target.cluster()
    server = target.rng.choice(target.zk_server_ids)
    started = time.monotonic()
    cluster.stop_zk(server, kill=True)
    return Fault(
        "zk-server-kill",
        f"zk-{server}",
        started,
        heal=lambda: cluster.start_zk(server),
        heal_at=started + target.session_s,
    )


def _zk_quorum_loss(target: Target, leader: Leader, _waits: Waits) -> Fault:
    cluster = target.cluster()
    ids = list(target.zk_server_ids)
    victims = sorted(target.rng.sample(ids, len(ids) // 2 + 1))
    started = time.monotonic()
    for server in victims:
        cluster.stop_zk(server, kill=True)

    def heal() -> None:
        for server in victims:
            cluster.start_zk(server)

    shown = ",".join(f"zk-{s}" for s in victims)
    return Fault(
        "zk-quorum-loss", shown, started, heal=heal, heal_at=started + 1.5 * target.session_s
    )


def _pg_restart(target: Target, leader: Leader, _waits: Waits) -> Fault:
    cluster = target.cluster()
    started = time.monotonic()
    cluster.stop_postgres("immediate")
    return Fault(
        "pg-restart",
        "postgres",
        started,
        heal=cluster.start_postgres,
        heal_at=started + PG_RESTART_DOWN_S,
    )


def _pg_failover(target: Target, leader: Leader, _waits: Waits) -> Fault:
    cluster = target.cluster()
    started = time.monotonic()
    cluster.pg_failover()
    # The retired primary comes back as the new synchronous standby (a fresh base backup).
    return Fault(
        "pg-failover",
        "postgres",
        started,
        heal=lambda: _rebuild_standby(cluster),
        heal_at=started,
    )


def _rebuild_standby(cluster: LocalCluster) -> None:
    cluster.up(migrate=False)


# -- the list ---------------------------------------------------------------------------------


def _db_extra(target: Target) -> float:
    return target.db_unreachable_s


def _clock_extra(target: Target) -> float:
    return target.clock_skew_handover_s


SCENARIOS: Final[dict[str, Scenario]] = {
    s.name: s
    for s in (
        Scenario("graceful", frozenset({SIGNALS}), True, _signal("graceful", "SIGTERM")),
        Scenario("step-down", frozenset({STEP_DOWN}), True, _step_down),
        Scenario("kill", frozenset({SIGNALS}), True, _signal("kill", "SIGKILL")),
        Scenario("pause", frozenset({SIGNALS}), True, _pause),
        Scenario("expire", frozenset({SESSIONS}), True, _expire),
        Scenario(
            "zk-partition-short", frozenset({LINKS}), False, _zk_cut("zk-partition-short", 1 / 3)
        ),
        Scenario("zk-partition-long", frozenset({LINKS}), True, _zk_cut("zk-partition-long", 2.0)),
        Scenario("pg-partition", frozenset({LINKS}), True, _pg_partition, _db_extra),
        Scenario("zk-server-kill", frozenset({ZK_SERVERS}), False, _zk_server_kill),
        Scenario("zk-quorum-loss", frozenset({ZK_SERVERS}), False, _zk_quorum_loss, rides_out=True),
        Scenario("pg-restart", frozenset({POSTGRES}), False, _pg_restart),
        Scenario("pg-failover", frozenset({POSTGRES, STANDBY}), False, _pg_failover),
        Scenario(
            "clock-ahead",
            frozenset({SIGNALS, LINKS, STEP_DOWN}),
            True,
            _clock("clock-ahead", CLOCK_AHEAD_OFFSET),
            _clock_extra,
        ),
        Scenario(
            "clock-behind",
            frozenset({SIGNALS, LINKS, STEP_DOWN}),
            True,
            _clock("clock-behind", CLOCK_BEHIND_OFFSET),
            _clock_extra,
        ),
        Scenario("host-death", frozenset({SIGNALS}), True, _host_death),
    )
}
"""Every scenario by name, in the order ``--scenario all`` runs them."""

MIXED: Final = "mixed"
ALL: Final = "all"
ROLLING_UPGRADE: Final = "rolling-upgrade"
"""Not a fault but a whole run of its own (:mod:`allocator.drill.upgrade`): asked for by name
with ``--from-release``, never part of ``all`` or ``mixed``."""

NEEDS_TEXT: Final = {
    SIGNALS: "signals to the node processes (a local cluster: --state-dir or --against)",
    SESSIONS: "the nodes' session files (a local cluster)",
    ZK_SERVERS: "control of the ZooKeeper servers (a local cluster)",
    POSTGRES: "control of PostgreSQL (a local cluster)",
    STANDBY: "a PostgreSQL standby (`allocator local up --pg-standby`, or the drill's own cluster)",
    LINKS: "the drill's proxies between each node and ZooKeeper/PostgreSQL (only a cluster "
    "the drill starts itself: --state-dir, not --against or --config)",
    STEP_DOWN: "the nodes' admin token",
}


def refusal(scenario: Scenario, capabilities: frozenset[str]) -> str | None:
    """Why ``scenario`` cannot run on a target with ``capabilities``; None if it can."""
    missing = sorted(scenario.needs - capabilities)
    if not missing:
        return None
    return f"scenario {scenario.name} needs " + "; ".join(NEEDS_TEXT[m] for m in missing)

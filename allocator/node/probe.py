"""The node's look at the database and at the election, every ``leader.probe_interval_s``.

Each round probes the database (reachable? does our clock agree?), reads the pool after a
probe that answered (:mod:`allocator.node.pool_watch`), publishes what the node advertises in its
election znode when that changed, and now and then reads the whole election to report znodes
that take no place in the queue or hold data that does not parse.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kazoo.exceptions import KazooException

from allocator.config import Config
from allocator.core import logs
from allocator.core.errors import AllocatorError
from allocator.core.health import NodeHealth
from allocator.core.leadership import SessionGuard
from allocator.metrics import NodeMetrics
from allocator.node.pacing import Pacing
from allocator.node.pool_watch import PoolWatch
from allocator.node.seams import NodeStore
from allocator.zookeeper.calls import ZooKeeperCallTimeoutError
from allocator.zookeeper.election import Election, Identity

log = logs.get_logger(__name__)


def ready(guard: SessionGuard, health: NodeHealth, pool_watch: PoolWatch) -> bool:
    """What ``/readyz`` answers: ZooKeeper connected, the database answered, the pool can
    take a burst (:mod:`allocator.node.pool_watch`)."""
    return bool(guard.connected and health.advert().db_ok and pool_watch.pool_ready)


def _first(items: tuple[str, ...], shown: int = 10) -> str:
    """Up to ``shown`` items for a log line (strangers could be many)."""
    more = f"; and {len(items) - shown} more" if len(items) > shown else ""
    return "; ".join(items[:shown]) + more


class Prober:
    """The node's probe thread: the database, the pool, its advert, and now and then the
    whole election.
    """

    def __init__(
        self,
        name: str,
        config: Config,
        *,
        store: NodeStore,
        now_ms: Callable[[], int],
        health: NodeHealth,
        metrics: NodeMetrics,
        pool_watch: PoolWatch,
        guard: SessionGuard,
        closing: threading.Event,
        pacing: Pacing,
        identity: Callable[[], Identity],
        election: Callable[[], Election | None],
        reconnected: Callable[[], None] = lambda: None,
    ) -> None:
        self._name = name
        self._config = config
        self._store = store
        self._now_ms = now_ms
        self._health = health
        self._metrics = metrics
        self._pool_watch = pool_watch
        self._guard = guard
        self._closing = closing
        self._pacing = pacing
        self._identity = identity
        self._election = election
        self._reconnected = reconnected
        """Called when the database answers again after it had not (the schema check)."""
        self._call: threading.Thread | None = None
        """The probe in flight (one at a time: see :meth:`loop`)."""
        self._published: Identity | None = None
        """What our znode advertises, as we last wrote it (None: not written yet)."""
        self._scanned_at = 0.0
        self._findings: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
        """(unparsable, ignored) znodes as last reported, so each change logs once."""

    def loop(self) -> None:
        """Every ``leader.probe_interval_s`` until the run closes: one round.

        Each probe runs on a thread of its own and has one interval to answer; one that has
        not answered by then counts as unreachable at once (no other starts until it ends).
        So an advert is never staler than about two intervals, however long the connection's
        own bounds (keepalives, ``tcp_user_timeout``) take to end a call on a black-holed
        path: a leader judging its contenders after ``leader.db_unreachable_s`` relies on it.
        The first round runs at once: a leader that must hand over judges a node that just
        joined by its advert. A bug in one round is logged; it must not end the adverts.
        """
        interval = self._config.leader.probe_interval_s
        while not self._closing.is_set():
            try:
                self._round(interval)
            except Exception:
                log.exception("probe_round_failed", name=self._name)
            self._closing.wait(interval)

    def _round(self, interval: float) -> None:
        """One round: probe, read the pool after an answer, publish the advert when it
        changed, scan the election when due.
        """
        if time.monotonic() - self._scanned_at >= self._pacing.election_scan_s:
            self._scanned_at = time.monotonic()
            self.scan_election()
        call = self._call
        if call is None or not call.is_alive():
            call = threading.Thread(target=self.probe_once, name="db-probe-call", daemon=True)
            self._call = call
            call.start()
        call.join(interval)
        if call.is_alive():
            self._unanswered(interval)
        self._metrics.ready.set(int(ready(self._guard, self._health, self._pool_watch)))
        identity = self._identity()
        election = self._election()
        if identity != self._published and election is not None and self._guard.connected:
            try:
                election.publish(identity)
                self._published = identity
            except (KazooException, ZooKeeperCallTimeoutError) as exc:
                log.warning("advert_failed", name=self._name, error=repr(exc))

    def probe_once(self) -> None:
        """One round trip: the database clock against ours; the pool after an answer. When
        the database answers after it had not, ``reconnected`` first (a database it cannot
        ask counts as unreachable, so the next answer asks again)."""
        bound = self._config.pool.max_clock_skew_ms
        try:
            reading = self._store.read_clock(self._now_ms)
            if self._health.advert().db_ok is False:
                self._reconnected()  # back after an outage: perhaps another schema
        except AllocatorError as exc:
            if self._health.advert().db_ok is not False:
                log.warning("database_unreachable", name=self._name, error=str(exc))
            self._health.probed(None, None)
            self._metrics.database_reachable.set(0)
            return
        agrees = not reading.disagrees(bound)
        if self._health.advert().db_ok is False:
            log.info("database_reachable", name=self._name)
        if not agrees and self._health.advert().clock_ok is not False:
            log.error(
                "clock_disagrees",
                name=self._name,
                offset_ms=round(reading.offset_ms),
                bound_ms=bound,
                note="this node's clock differs from the database server's; it will not cut",
            )
        self._health.probed(reading.offset_ms, agrees)
        self._metrics.database_reachable.set(1)
        self._metrics.clock_offset_seconds.set(reading.offset_ms / 1000)
        self._metrics.clock_skew.set(0 if agrees else 1)
        self._pool_watch.maybe_read()  # here, not in the loop: a hung read is an unanswered probe

    def _unanswered(self, waited_s: float) -> None:
        if self._health.advert().db_ok is not False:
            log.warning(
                "database_unreachable",
                name=self._name,
                error=f"no answer to the probe within {waited_s:.1f} s",
            )
        self._health.probed(None, None)
        self._metrics.database_reachable.set(0)

    def scan_election(self) -> None:
        """Report (metrics, one log line per change) election znodes that take no place
        in the queue or hold data that does not parse; the order never depends on them."""
        election = self._election()
        if election is None or not self._guard.connected:
            return
        try:
            queue = election.queue()
        except (KazooException, ZooKeeperCallTimeoutError) as exc:
            log.warning("election_scan_failed", name=self._name, error=repr(exc))
            return
        unparsable = tuple(f"{c.znode} ({c.problem})" for c in queue.unparsable)
        ignored = tuple(f"{i.znode} ({i.reason})" for i in queue.ignored)
        self._metrics.election_queue_length.set(len(queue.contenders))
        self._metrics.election_unparsable_znodes.set(len(unparsable))
        self._metrics.election_ignored_znodes.set(len(ignored))
        last_unparsable, last_ignored = self._findings
        if unparsable and unparsable != last_unparsable:
            log.warning(
                "election_znodes_unparsable",
                name=self._name,
                count=len(unparsable),
                znodes=_first(unparsable),
                note="their data is not what our nodes write; they keep their place in the queue",
            )
        if ignored and ignored != last_ignored:
            log.warning(
                "election_znodes_ignored",
                name=self._name,
                count=len(ignored),
                znodes=_first(ignored),
                note="not contenders",
            )
        self._findings = (unparsable, ignored)

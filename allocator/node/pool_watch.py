"""Every node's own reading of the pool: the pool metrics and the node's readiness.

Every node, leader or not, reads ``allocator.pool_status`` itself, so the pool metrics do
not depend on which node leads or whether one does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from allocator.config import Config, runway
from allocator.core import logs
from allocator.core.errors import AllocatorError
from allocator.core.records import PoolStatus
from allocator.metrics import NodeMetrics

log = logs.get_logger(__name__)


class PoolReader(Protocol):
    """What the watch reads from the database."""

    def pool_status(self) -> PoolStatus: ...


class PoolWatch:
    """The node's last pool reading, its readiness, and when to read again.

    Thread-safe: the probe thread reads, the admin server's threads ask :attr:`pool_ready`.
    A failed reading changes nothing but is logged once per outage (the probe already judges
    the database's reachability).
    """

    def __init__(
        self,
        store: PoolReader,
        config: Config,
        metrics: NodeMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._floor = config.pool.min_blocks
        self._interval_s = config.pool.sample_interval_s
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._pool_ready = False
        self._failing = False
        self.last: PoolStatus | None = None
        metrics.pool_runway_needed_seconds.set(runway.needed_runway_s(config))

    @property
    def pool_ready(self) -> bool:
        """Whether the pool can take a burst (``/readyz``'s pool part).

        True once the pool reached ``pool.min_blocks`` (the level the leader keeps whatever
        the rate, sized for a step from idle to the fastest claim rate while the low-water
        check wakes the refill) and it has not run empty since. The hysteresis keeps
        readiness from flapping while consumers draw the pool below the floor between
        refills. Paused claims do not change it: consumers retry AL004 like an empty pool.
        """
        with self._lock:
            return self._pool_ready

    def maybe_read(self) -> None:
        """Read the pool if a reading is due (the probe thread calls it after each probe).

        Due once per ``pool.sample_interval_s``, and on every probe while the pool is not
        ready, so ``/readyz`` turns ready within a probe interval of the pool filling.
        """
        with self._lock:
            due = (
                not self._pool_ready
                or self._read_at is None
                or self._clock() - self._read_at >= self._interval_s
            )
        if due:
            self.read()

    def read(self) -> PoolStatus | None:
        """One reading: metrics and readiness; None if the database did not answer."""
        try:
            status = self._store.pool_status()
        except AllocatorError as exc:
            if not self._failing:
                log.warning("pool_read_failed", error=str(exc))
            self._failing = True
            return None
        self._failing = False
        self.observe(status)
        return status

    def observe(self, status: PoolStatus) -> None:
        """A reading of ``pool_status`` made here or by the leader's jobs: metrics,
        readiness, and no reading of our own until the next one is due.

        The leader's jobs read it on every refill and sample anyway and hand it over
        (:class:`allocator.node.seams.LeaderHooks`), so a leader does not read the pool once
        more. Whether an operator paused claims (migration 0010) comes with it:
        ``allocator_claims_paused``, ``/status``'s ``pool.claims_paused`` and a
        ``claims_paused`` / ``claims_resumed`` log line when it changes.
        """
        self._metrics.pool_observed(
            status.available_blocks,
            status.runway_s,
            status.claim_rate_blocks_per_s,
            claims_paused=status.claims_paused,
        )
        with self._lock:
            self._read_at = self._clock()
            was_paused = self.last.claims_paused if self.last is not None else False
            self.last = status
            was_ready = self._pool_ready
            if status.available_blocks >= self._floor:
                self._pool_ready = True
            elif status.available_blocks == 0:
                self._pool_ready = False
            now_ready = self._pool_ready
        if status.claims_paused != was_paused:
            log.info("claims_paused" if status.claims_paused else "claims_resumed")
        if now_ready != was_ready:
            log.info(
                "pool_ready" if now_ready else "pool_drained",
                available_blocks=status.available_blocks,
                min_blocks=self._floor,
            )

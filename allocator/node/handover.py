"""Whether a leader should hand over now: a reason that applies AND a fit contender
(docs/design.md §11).
"""

from __future__ import annotations

from allocator.config import Config, runway
from allocator.core import health, logs
from allocator.core.health import NodeHealth
from allocator.metrics import NodeMetrics
from allocator.node.contenders import fit_contenders
from allocator.node.pool_watch import PoolWatch
from allocator.zookeeper.election import Election

log = logs.get_logger(__name__)


class Handover:
    """The leader's hand-over decision, asked every ``Pacing.handover_check_s``.

    A leader whose clock has disagreed for ``leader.clock_skew_handover_s``, or whose writes
    have all failed for ``leader.db_unreachable_s`` (:mod:`allocator.core.health`), hands
    over, but only to a contender that advertises a reachable database and an agreeing
    clock; otherwise it keeps leading and reports the hand-over as withheld (no churn). A
    leader whose clock disagrees while the pool holds less than a hand-over's runway hands
    over at once.
    """

    def __init__(
        self,
        name: str,
        config: Config,
        health: NodeHealth,
        pool_watch: PoolWatch,
        metrics: NodeMetrics,
    ) -> None:
        self._name = name
        self._config = config
        self._health = health
        self._pool_watch = pool_watch
        self._metrics = metrics
        self.withheld: str | None = None
        """The reason a handover is due but withheld (``/status``), or None."""

    def due(self, election: Election) -> str | None:
        """A reason to step down now, if one applies AND a fit contender would take over."""
        leader = self._config.leader
        reason = self._health.handover_reason(leader.clock_skew_handover_s, leader.db_unreachable_s)
        if reason is None and self._cannot_cut_and_pool_short():
            reason = health.CLOCK_SKEW  # at once: waiting out the handover delay drains the pool
        if reason is None:
            if self.withheld is not None:
                log.info("handover_no_longer_needed", name=self._name)
            self.reset()
            return None
        fit = fit_contenders(election)
        if fit:
            log.warning("handing_over", name=self._name, reason=reason, to=fit[0].identity.name)
            return reason
        if self.withheld != reason:
            log.error(
                "handover_withheld",
                name=self._name,
                reason=reason,
                note="no contender advertises a reachable database and an agreeing clock; "
                "keeping the lead, serving the pool",
            )
        self.withheld = reason
        self._metrics.handover_withheld.set(1)
        return None

    def reset(self) -> None:
        """A new term: forget what the last one withheld."""
        self.withheld = None
        self._metrics.handover_withheld.set(0)

    def _cannot_cut_and_pool_short(self) -> bool:
        """True while this leader's clock disagrees with the database's (it may not cut) and
        the pool holds less than the runway a handover needs (or nothing): a cold cluster
        whose first leader's clock is wrong must not wait ``leader.clock_skew_handover_s``
        with an empty pool while a sound contender queues."""
        disagreeing_s = self._health.clock_disagreeing_for_s()
        if disagreeing_s is None or disagreeing_s < self._config.leader.probe_interval_s:
            return False  # not on one noisy reading
        status = self._pool_watch.last
        if status is None:
            return False
        if status.available_blocks == 0:
            return True
        return status.runway_s is not None and status.runway_s < runway.needed_runway_s(
            self._config
        )

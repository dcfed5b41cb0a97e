"""Why this node, first in the election, cannot take the fence, as it reports it (the
*blocked* state, docs/design.md §4).
"""

from __future__ import annotations

from typing import Any

from allocator import fence
from allocator.core import logs
from allocator.metrics import NodeMetrics
from allocator.node.signals import Signals

log = logs.get_logger(__name__)

DATABASE_UNREACHABLE = "database_unreachable"
GENERATION_UNREADABLE = "fence_generation_unreadable"
FENCE_AHEAD = "fence_ahead_of_zookeeper"
DATABASE_BEHIND = "database_behind_zookeeper"


class Blockers:
    """The node's blocked reason and the two reports that come with some, shown the same
    ways.

    Each reason shows as the role ``blocked``, ``/status`` ``blocked`` (reason and detail),
    ``allocator_blocked{reason}`` and the node's advert, with one log line per new reason.
    The fence ahead of ZooKeeper and the database behind ZooKeeper's watermark carry a
    report of their own as well (``/status`` and a metric each).
    """

    def __init__(self, name: str, metrics: NodeMetrics, signals: Signals) -> None:
        self._name = name
        self._metrics = metrics
        self._signals = signals
        self.blocked: dict[str, str] | None = None
        """``{reason, detail}`` while blocked; replaced whole, never changed in place (other
        threads read it without a lock)."""
        self.fence_ahead: dict[str, Any] | None = None
        self.database_behind: dict[str, Any] | None = None

    def block(self, reason: str, detail: str) -> None:
        """Report why this node, first in the election, does not take the fence."""
        if self.blocked is None or self.blocked["reason"] != reason:
            log.error("blocked", name=self._name, reason=reason, detail=detail)
        self.blocked = {"reason": reason, "detail": detail}
        self._signals.role = "blocked"
        self._metrics.blocked_by(reason)

    def unblock(self) -> None:
        """Blocked no more (left the queue, or took the fence): reason and metric cleared."""
        if self.blocked is not None:
            log.info("unblocked", name=self._name, reason=self.blocked["reason"])
        self.blocked = None
        self._metrics.blocked_by(None)

    def reason(self) -> str | None:
        """What the advert says (read once: another thread may unblock meanwhile)."""
        blocked = self.blocked
        return blocked["reason"] if blocked else None

    def clear_all(self) -> None:
        """A takeover succeeded, or a new session will judge again."""
        self.clear_fence_ahead()
        self.clear_database_behind()
        self.unblock()

    # -- the fence ahead of ZooKeeper (an ensemble wiped or restored) ----------------------

    def fence_is_ahead(self, held: fence.Token, zk_generation: int, newest_zxid: int) -> None:
        """Report the fence ahead of ZooKeeper: what the database holds against what
        ZooKeeper can have issued.
        """
        state = {
            "fence": {"generation": held.generation, "epoch": held.epoch},
            "zookeeper": {"generation": zk_generation, "newest_zxid": newest_zxid},
        }
        if self.fence_ahead != state:
            log.critical(
                "fence_ahead_of_zookeeper",
                name=self._name,
                fence=str(held),
                zookeeper_generation=zk_generation,
                newest_zxid=f"{newest_zxid:#x}",
                note="the ensemble was wiped or restored; nobody can take the fence until an "
                "operator runs `allocator fence rebase`",
            )
        self.fence_ahead = state
        self._metrics.fence_ahead_of_zookeeper.set(1)
        self.block(
            FENCE_AHEAD,
            f"the fence {held} is newer than anything this ensemble issued (generation "
            f"{zk_generation}, newest zxid {newest_zxid:#x})",
        )

    def clear_fence_ahead(self) -> None:
        """The fence is no longer ahead of ZooKeeper: drop its report."""
        if self.fence_ahead is not None:
            log.info("fence_ahead_cleared", name=self._name)
        self.fence_ahead = None
        self._metrics.fence_ahead_of_zookeeper.set(0)

    # -- the database below ZooKeeper's watermark (restored, or a lossy failover) ----------

    def database_is_behind(
        self, reason: str, token: fence.Token, high_water_id: int, copy: fence.Watermark
    ) -> None:
        """Report it (``/status``, metric, a log line per change); a leader's jobs call this
        too, so it does not block by itself (see :meth:`block`)."""
        state = {
            "reason": reason,
            "database": {
                "generation": token.generation,
                "epoch": token.epoch,
                "high_water_id": high_water_id,
            },
            "watermark": copy.to_json(),
        }
        if self.database_behind != state:
            log.critical(
                "database_behind_zookeeper",
                name=self._name,
                reason=reason,
                note="the database was restored or failed over to a standby that missed "
                "commits; no takeover and no cut until an operator resets the pool",
            )
        self.database_behind = state
        self._metrics.database_behind_zookeeper.set(1)

    def clear_database_behind(self) -> None:
        """The database is no longer behind the watermark: drop its report."""
        if self.database_behind is not None:
            log.info("database_behind_cleared", name=self._name)
        self.database_behind = None
        self._metrics.database_behind_zookeeper.set(0)

"""ZooKeeper's copy of what the database holds (:mod:`allocator.fence`), as a node keeps it."""

from __future__ import annotations

import threading
import time

from kazoo.exceptions import KazooException

from allocator import fence
from allocator.core import logs
from allocator.core.errors import AllocatorError
from allocator.fence.znodes import FenceReads
from allocator.node.blockers import Blockers
from allocator.zookeeper.election import Election

log = logs.get_logger(__name__)


class WatermarkKeeper:
    """The node's reads and raises of the watermark.

    Read before each takeover (the takeover compares the database with it in its own
    transaction), raised right after a takeover, following the committed cuts at most once
    per :data:`~allocator.fence.WATERMARK_INTERVAL_S`, and flushed at every term end. A
    leader's jobs ask it whether the database went backwards.
    """

    def __init__(self, name: str, blockers: Blockers) -> None:
        self._name = name
        self._blockers = blockers
        self._lock = threading.Lock()
        self._pending: int | None = None
        """The last ID of the newest committed cut not yet written into ZooKeeper."""
        self._raised_at = 0.0
        self.last: fence.Watermark | None = None
        """ZooKeeper's watermark as this node last read or raised it."""

    def read(self, election: Election, reads: FenceReads | None = None) -> fence.Watermark | None:
        """The watermark for a takeover's comparison (from ``reads`` when sent already); one
        that does not parse is reported and ignored (it cannot make a node refuse to lead)."""
        try:
            copy = election.fence.watermark() if reads is None else reads.watermark()
        except ValueError as exc:
            log.error("watermark_unreadable", name=self._name, error=str(exc), note="ignored")
            copy = None
        self.last = copy
        return copy

    def database_went_back(self, high_water_id: int, token: fence.Token) -> bool:
        """A leader's jobs (any thread): True, and reported, if the database's mark fell
        below the watermark this node knows."""
        copy = self.last
        if copy is None or high_water_id >= copy.high_water_id:
            if self._blockers.database_behind is not None and copy is not None:
                self._blockers.clear_database_behind()
            return False
        reason = fence.database_behind(token, high_water_id, copy)
        assert reason is not None
        self._blockers.database_is_behind(reason, token, high_water_id, copy)
        return True

    def record_cut(self, high_water_id: int) -> None:
        """A committed cut (a job thread): noted only. The leader's loop raises the watermark
        (:meth:`catch_up`): a ZooKeeper call here would hold the refill up to a call timeout
        while the session is suspended, stretching it into a successor's term."""
        with self._lock:
            pending = self._pending
            self._pending = max(high_water_id, pending if pending is not None else -1)

    def forget_cuts(self) -> None:
        """A new term: cuts of an earlier one were flushed when it ended."""
        with self._lock:
            self._pending = None

    def catch_up(self, election: Election, token: fence.Token) -> None:
        """The leader's loop: a cut the rate limit held back is written once it may be."""
        with self._lock:
            if self._pending is None:
                return
            if time.monotonic() - self._raised_at < fence.WATERMARK_INTERVAL_S:
                return
        self.flush(election, token)

    def flush(self, election: Election, token: fence.Token) -> None:
        """At a term's end: the cuts the rate limit held back."""
        with self._lock:
            mark, self._pending = self._pending, None
        if mark is not None:
            self.raise_to(election, fence.Watermark(token, mark))

    def raise_to(self, election: Election, mark: fence.Watermark) -> None:
        """Best effort: a watermark that lags only makes the check less sensitive."""
        self._raised_at = time.monotonic()
        try:
            self.last = election.fence.raise_watermark(mark)
        except (KazooException, AllocatorError) as exc:
            log.warning("watermark_raise_failed", name=self._name, error=repr(exc))

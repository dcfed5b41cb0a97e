"""First in the election: take the fence, or say why not and wait (the node is *blocked*).

The takeover itself and the fence's rules: docs/design.md §3; the blocked state: §4.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.exceptions import KazooException

from allocator import fence
from allocator.core import logs
from allocator.core.errors import (
    AllocatorError,
    DatabaseBehindError,
    DatabaseError,
    DatabaseUnavailableError,
    LayoutMismatchError,
    StaleTakeoverError,
)
from allocator.core.health import NodeHealth
from allocator.core.records import Takeover
from allocator.fence.znodes import FenceReads
from allocator.metrics import NodeMetrics
from allocator.node.blockers import (
    DATABASE_BEHIND,
    DATABASE_UNREACHABLE,
    GENERATION_UNREADABLE,
    Blockers,
)
from allocator.node.contenders import fit_contenders, leave
from allocator.node.exits import EXIT_CONFIG
from allocator.node.pacing import Pacing
from allocator.node.seams import NodeStore
from allocator.node.signals import Signals
from allocator.node.step_clock import StepClock
from allocator.node.watermark import WatermarkKeeper
from allocator.zookeeper.election import Election

log = logs.get_logger(__name__)


@dataclass(frozen=True)
class Taken:
    """A committed takeover: our token holds the fence."""

    token: fence.Token
    takeover: Takeover


class Candidacy:
    """First in the election: one takeover attempt at a time, and what to do when it fails.

    - The token is ``(generation, czxid)``: our own znode's czxid and the generation our own
      session reads beside the election path. An unparsable generation blocks the node
      (every node reads the same znode).
    - The watermark comparison runs inside the takeover's own transaction: no fence is taken
      without it; a database below the watermark blocks the node.
    - A takeover refused as stale (AL101) is a race (another node took a newer token: leave,
      back off, join again) or the fence is ahead of ZooKeeper (an ensemble wiped or
      restored): nobody could take it, so leaving would only churn: blocked, staying first.
    - No database (the probe failed, or the takeover did while the probe failed too): leave
      at once when a contender advertises a reachable database and an agreeing clock;
      otherwise stay first, blocked, until one queues or the probe reaches the database. A
      takeover that fails while the probe reaches the database (a lock or statement timeout
      behind a paused ex-leader's transaction) is tried again, staying first.
    - A token is taken once: a znode whose token served a term that ended (the session was
      kept across a loss, :meth:`allocator.node.session.ZooKeeperSession.recover`) is left
      and the node joins again at the back, with a new znode and a new token.
    """

    def __init__(
        self,
        name: str,
        host: str,
        pid: int,
        *,
        store: NodeStore,
        health: NodeHealth,
        metrics: NodeMetrics,
        blockers: Blockers,
        watermark: WatermarkKeeper,
        signals: Signals,
        pacing: Pacing,
        spent: Callable[[], fence.Token | None] = lambda: None,
    ) -> None:
        self._name = name
        self._spent = spent
        self._host = host
        self._pid = pid
        self._store = store
        self._health = health
        self._metrics = metrics
        self._blockers = blockers
        self._watermark = watermark
        self._signals = signals
        self._pacing = pacing

    def take(self, election: Election, steps: StepClock | None = None) -> Taken | int | None:
        """The fence taken; or an exit code (a layout mismatch: 78); or None: not now (the
        reason reported, the back-off done). ``steps`` times the takeover's steps."""
        steps = steps or StepClock()
        reads = election.fence.start_reads()  # in flight while our own znode is read
        token = self._token(election, reads, steps)
        if token is None:
            self._signals.pause(self._pacing.blocked_retry_s)
            return None
        if token == self._spent():
            # A session kept across a loss keeps its znode, whose token served the term that
            # loss ended: the fence holds it already, so only a new znode brings a new one.
            log.info("election_rejoined", name=self._name, reason="token_served_a_term")
            self.leave(election)
            return None
        if self._health.advert().db_ok is False:
            # The probe already failed: a takeover would only wait out the dead path.
            self._database_unreachable(election, "the last probe did not reach the database")
            return None
        watermark = self._watermark.read(election, reads)
        steps.lap("watermark_read")
        try:
            takeover = self._store.take_fence(token, self._name, self._host, self._pid, watermark)
            steps.lap("fence_taken")
        except DatabaseBehindError as exc:
            assert watermark is not None
            held = fence.Token(exc.generation, exc.epoch)
            self._blockers.database_is_behind(exc.reason, held, exc.high_water_id, watermark)
            self._blockers.block(DATABASE_BEHIND, exc.reason)
            self._signals.pause(self._pacing.blocked_retry_s)
            return None
        except StaleTakeoverError as exc:
            if self._fence_ahead(election, token):
                self._signals.pause(self._pacing.blocked_retry_s)
                return None
            log.error("fence_stale", name=self._name, token=str(token), error=str(exc))
            self.leave(election)
            self._signals.pause(self._pacing.stale_takeover_backoff_s)
            return None
        except LayoutMismatchError as exc:
            self._metrics.layout_mismatch.set(1)
            log.critical("layout_mismatch", name=self._name, error=str(exc))
            self.leave(election)
            return EXIT_CONFIG
        except DatabaseUnavailableError as exc:
            log.error("takeover_failed", name=self._name, token=str(token), error=str(exc))
            if self._health.advert().db_ok:
                # The probe reaches the database: a lock or statement timeout, not a dead
                # path. Stay first and try again; the next probe tells if the path died.
                self._signals.pause(self._pacing.stale_takeover_backoff_s)
            else:
                self._database_unreachable(election, str(exc))
            return None
        except DatabaseError as exc:
            log.error("takeover_failed", name=self._name, token=str(token), error=str(exc))
            self.leave(election)
            self._signals.pause(self._pacing.stale_takeover_backoff_s)
            return None
        self._blockers.clear_all()
        return Taken(token, takeover)

    def leave(self, election: Election) -> None:
        """Leave the queue: a node that leaves is blocked no more (it queues at the back)."""
        self._blockers.unblock()
        leave(election, self._name)

    def _token(self, election: Election, reads: FenceReads, steps: StepClock) -> fence.Token | None:
        """Our token, or None when the generation znode holds garbage (blocked: ``allocator
        fence rebase`` rewrites it)."""
        czxid = election.token()
        steps.lap("own_znode_read")
        try:
            generation = reads.generation()
            steps.lap("generation_read")
        except ValueError as exc:
            self._blockers.block(GENERATION_UNREADABLE, str(exc))
            return None
        return fence.Token(generation, czxid)

    def _fence_ahead(self, election: Election, token: fence.Token) -> bool:
        """After a stale takeover: True (and reported) if ZooKeeper is behind the fence."""
        try:
            held = self._store.fence().token
            newest = election.fence.newest_zxid()
        except (AllocatorError, KazooException) as exc:
            log.warning("fence_check_failed", name=self._name, error=str(exc))
            return False
        if not fence.ahead_of_zookeeper(held, token.generation, newest):
            return False
        self._blockers.fence_is_ahead(held, token.generation, newest)
        return True

    def _database_unreachable(self, election: Election, detail: str) -> None:
        """Make way for a contender that reaches the database; when nobody does, stay first
        (rotating the queue would be churn for nothing), blocked, until a fit contender
        queues or the database answers again."""
        if self._make_way(election):
            return
        self._blockers.block(DATABASE_UNREACHABLE, detail)
        deadline = time.monotonic() + self._pacing.blocked_retry_s
        while not self._signals.interrupt.wait(self._pacing.recheck_s):
            if self._make_way(election) or self._health.advert().db_ok:
                return  # made way, or reachable again: the loop tries the takeover now
            if time.monotonic() >= deadline:
                return

    def _make_way(self, election: Election) -> bool:
        """Leave if a contender advertises a reachable database and an agreeing clock (it
        takes over at once; we queue again at the back). True if we left."""
        fit = fit_contenders(election)
        if not fit:
            return False
        log.warning(
            "making_way", name=self._name, reason="database_unreachable", to=fit[0].identity.name
        )
        self.leave(election)
        self._signals.role = "follower"
        self._signals.pause(self._pacing.stale_takeover_backoff_s)
        return True

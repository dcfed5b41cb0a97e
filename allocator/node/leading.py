"""A leader's term: from the committed takeover to its end, by the table of
:mod:`allocator.node.term_end`.

The term's rules (writes only inside a term, checked before starting and before COMMIT;
SUSPENDED pauses it) are docs/design.md §4.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kazoo.exceptions import KazooException

from allocator import fence
from allocator.core import logs
from allocator.core.errors import AllocatorError, FencedError, LayoutMismatchError
from allocator.core.health import NodeHealth
from allocator.core.leadership import SessionGuard, Term
from allocator.core.records import Takeover
from allocator.metrics import NodeMetrics
from allocator.node.contenders import leave
from allocator.node.exits import EXIT_CONFIG, EXIT_FENCED
from allocator.node.handover import Handover
from allocator.node.pacing import Pacing
from allocator.node.pool_watch import PoolWatch
from allocator.node.seams import LeaderHooks, LeaderJobsPort, NodeStore
from allocator.node.signals import Signals
from allocator.node.step_clock import StepClock
from allocator.node.term_end import RULES, TermEnd
from allocator.node.watermark import WatermarkKeeper
from allocator.zookeeper.calls import ZooKeeperCallTimeoutError
from allocator.zookeeper.election import Election, ElectionNodeLostError

log = logs.get_logger(__name__)

TermFactory = Callable[[fence.Token, SessionGuard], Term]


class Leading:
    """The leader's side of the node: begin a term, watch it, end it by the term-end table.

    - SUSPENDED pauses the term at once (:meth:`pause_term`, from the session's listener).
      Reconnecting with the same session resumes it only after the loop re-checks that our
      znode still exists, owned by this session with the same czxid; that check also runs
      every ``Pacing.recheck_s``.
    - A write rejected as fenced (AL100) ends the term with exit 4; an error no retry can
      help (a layout the database does not know, AL104) ends it with the error's own code.
    - Graceful step-down and SIGTERM: stop the jobs, record the end, delete the znode (the
      next contender takes over at once).
    """

    def __init__(
        self,
        name: str,
        *,
        store: NodeStore,
        jobs: LeaderJobsPort,
        health: NodeHealth,
        metrics: NodeMetrics,
        pool_watch: PoolWatch,
        guard: SessionGuard,
        handover: Handover,
        watermark: WatermarkKeeper,
        signals: Signals,
        pacing: Pacing,
        term_factory: TermFactory,
        check_clock: Callable[[], None],
    ) -> None:
        self._name = name
        self._store = store
        self._jobs = jobs
        self._health = health
        self._metrics = metrics
        self._pool_watch = pool_watch
        self._guard = guard
        self._handover = handover
        self._watermark = watermark
        self._signals = signals
        self._pacing = pacing
        self._term_factory = term_factory
        self._check_clock = check_clock
        self.term: Term | None = None
        self.last_token: fence.Token | None = None
        """The token of the last term this node led (ended or not): never taken again."""
        self._fatal: AllocatorError | None = None

    # -- from other threads ---------------------------------------------------------------

    def request_step_down(self) -> bool:
        """Ask the leader to hand over; False when this node is not leading."""
        term = self.term
        if term is None or term.ended:
            return False
        self._signals.ask(self._signals.step_down)
        return True

    def pause_term(self) -> None:
        """The session is in doubt (kazoo's listener): stop writing at once."""
        term = self.term
        if term is not None:
            term.pause()

    def _on_fenced(self, exc: FencedError) -> None:
        """A job's write was rejected as fenced (any thread): end the term, exit 4."""
        log.error("fenced_write_rejected", name=self._name, error=str(exc))
        self.pause_term()
        self._signals.fenced.set()
        self._signals.wake.set()

    def _on_fatal(self, exc: AllocatorError) -> None:
        """A job met an error no retry can help (any thread): end the term with its exit
        code.
        """
        log.critical("fatal_write_error", name=self._name, error=str(exc))
        if isinstance(exc, LayoutMismatchError):
            self._metrics.layout_mismatch.set(1)
        self.pause_term()
        self._fatal = exc
        self._signals.wake.set()

    # -- the term -------------------------------------------------------------------------

    def lead(
        self,
        election: Election,
        token: fence.Token,
        takeover: Takeover,
        steps: StepClock | None = None,
    ) -> int | None:
        """Lead until the term ends; an exit code when the node must stop, else None.
        ``steps`` times the takeover's steps, logged once the jobs started."""
        term = self._begin(token, takeover, election, steps or StepClock())
        reason = self._watch(term, election)
        return self._end(term, reason, election)

    def _begin(
        self, token: fence.Token, takeover: Takeover, election: Election, steps: StepClock
    ) -> Term:
        """Start a term on a committed takeover: activate it, raise the watermark, start the
        jobs.
        """
        term = self._term_factory(token, self._guard)
        self.term = term
        self.last_token = token
        self._fatal = None
        self._signals.fenced.clear()
        term.activate()
        self._signals.role = "leader"
        self._signals.since = time.time()
        self._health.term_started()
        self._metrics.terms.inc()
        self._metrics.fence_epoch.set(token.epoch)
        self._metrics.fence_generation.set(token.generation)
        self._metrics.is_leader.set(1)
        log.info(
            "elected",
            name=self._name,
            epoch=token.epoch,
            generation=token.generation,
            previous_epoch=takeover.previous_epoch,
            previous_generation=takeover.previous_generation,
            high_water_id=takeover.high_water_id,
        )
        log.info("fence_taken", name=self._name, token=str(token))
        steps.lap("term_begun")
        self._check_clock()  # one probe, so the first refill knows where it stands
        steps.lap("clock_probed")
        self._watermark.forget_cuts()
        self._watermark.raise_to(election, fence.Watermark(token, takeover.high_water_id))
        steps.lap("watermark_raised")
        self._jobs.start(
            term,
            LeaderHooks(
                health=self._health,
                on_fenced=self._on_fenced,
                on_fatal=self._on_fatal,
                database_went_back=lambda mark: self._watermark.database_went_back(mark, token),
                cut_recorded=self._watermark.record_cut,
                pool_read=self._pool_watch.observe,
            ),
        )
        steps.lap("jobs_started")
        log.info("takeover_steps", name=self._name, epoch=token.epoch, **steps.fields())
        return term

    def _watch(self, term: Term, election: Election) -> TermEnd:
        """Wait while leading; return why the term ends. Pauses/resumes on session flaps."""
        signals = self._signals
        next_handover_check = time.monotonic()
        while True:
            signals.wake.wait(self._pacing.recheck_s)
            signals.wake.clear()
            if self._guard.check_timer() or self._guard.lost:
                return TermEnd.SESSION_LOST
            if self._fatal is not None:
                return TermEnd.FATAL
            if signals.fenced.is_set():
                return TermEnd.FENCED
            if signals.stop.is_set():
                return TermEnd.SHUTDOWN
            if signals.step_down.is_set():
                signals.step_down.clear()
                return TermEnd.STEPPED_DOWN
            if not self._guard.connected:
                term.pause()
                continue
            try:
                if not election.still_ours() or election.token() != term.epoch:
                    return TermEnd.ZNODE_LOST
                if time.monotonic() >= next_handover_check:
                    next_handover_check = time.monotonic() + self._pacing.handover_check_s
                    reason = self._handover.due(election)
                    if reason is not None:
                        return TermEnd(reason)
            except (KazooException, ElectionNodeLostError, ZooKeeperCallTimeoutError):
                term.pause()
                continue
            if not term.may_write():
                log.info("resumed", name=self._name, epoch=term.epoch)
            term.activate()
            self._watermark.catch_up(election, term.token)

    def _end(self, term: Term, reason: TermEnd, election: Election) -> int | None:
        """Everything a term's end asks, in order (:data:`~allocator.node.term_end.RULES`).

        Rule: the znode is deleted (``rule.leave``) only once the jobs stopped, the watermark
        was flushed and the end was recorded: the successor's takeover, which follows the
        delete at once, then finds both (docs/design.md §3)."""
        rule = RULES[reason]
        token = term.token
        asked = reason in (TermEnd.SHUTDOWN, TermEnd.STEPPED_DOWN)
        steps = StepClock(self._signals.asked_at if asked else None)
        steps.lap("noticed")
        term.end(reason.value)
        if rule.leave_first:
            leave(election, self._name)
        self._metrics.leadership_ended()
        self._handover.reset()
        self._health.term_ended()
        if not self._jobs.stop(self._pacing.job_stop_timeout_s):
            log.error("job_stop_timeout", name=self._name, token=str(token))
        steps.lap("jobs_stopped")
        self._metrics.leadership_ended()  # again: the run that was in flight may have set one
        # The watermark (ZooKeeper) and the term's end (the database) are independent
        # writes: written side by side, and both done before the znode is deleted.
        flushing = threading.Thread(
            target=self._watermark.flush, args=(election, token), name="watermark-flush"
        )
        flushing.start()
        self._signals.role = rule.role_after
        self.term = None
        log.info("stepped_down", name=self._name, token=str(token), reason=reason.value)
        if rule.record_end:
            self._end_term(token, reason.value)
        flushing.join()
        steps.lap("term_recorded_and_watermark_flushed")
        if rule.leave:
            leave(election, self._name)  # hands over at once; the others join at the back
        steps.lap("znode_deleted")
        log.info("term_end_steps", name=self._name, reason=reason.value, **steps.fields())
        if not rule.exits:
            return None
        if reason is TermEnd.FENCED:
            return EXIT_FENCED
        return self._fatal.exit_code if self._fatal else EXIT_CONFIG

    def _end_term(self, token: fence.Token, reason: str) -> None:
        try:
            self._store.end_term(token, reason)
        except AllocatorError as exc:
            log.warning("end_term_failed", token=str(token), error=str(exc))

"""Fake leader jobs (the :class:`allocator.node.seams.LeaderJobsPort` port) and a fake clock.

Rules of the fake jobs:

- They record what the node asks: the scheduler started and shut down, every term's
  ``start`` with the hooks it came with, every ``stop``. ``stop`` always succeeds at once.
- They check the port's contract, raising ``AssertionError`` in the node's thread (so the
  node's run fails and the test with it): ``start`` only after ``start_scheduler``, never
  after ``shutdown``, and never while another term's jobs are running.
- They write nothing. A test plays the jobs' part through the hooks the node handed over:
  :meth:`FakeJobs.report_write` (a fenced write committed: ``hooks.health.write_succeeded()``,
  only while the term may write, as real jobs pass ``commit_if=term.may_write``),
  :meth:`FakeJobs.report_fenced` and :meth:`FakeJobs.report_fatal`.

:class:`FakeMonotonic` is a monotonic clock that moves only when a test advances it (for
:class:`allocator.core.health.NodeHealth`).
"""

from __future__ import annotations

import threading

from allocator.core.errors import AllocatorError, FencedError
from allocator.core.health import NodeHealth
from allocator.core.leadership import Term
from allocator.node.seams import LeaderHooks


class FakeJobs:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.scheduler_started = False
        self.shut_down = False
        self.terms: list[Term] = []
        """Every term whose jobs were started, oldest first."""
        self.stops = 0
        self._running: tuple[Term, LeaderHooks] | None = None

    # -- the port -------------------------------------------------------------------------

    def start_scheduler(self) -> None:
        with self._lock:
            assert not self.scheduler_started, "start_scheduler called twice"
            self.scheduler_started = True

    def shutdown(self) -> None:
        with self._lock:
            self.shut_down = True

    def start(self, term: Term, hooks: LeaderHooks) -> None:
        with self._lock:
            assert self.scheduler_started, "jobs started before the scheduler"
            assert not self.shut_down, "jobs started after shutdown"
            assert self._running is None, "jobs started while another term's jobs run"
            self.terms.append(term)
            self._running = (term, hooks)

    def stop(self, timeout_s: float) -> bool:
        with self._lock:
            if self._running is not None:
                self.stops += 1
            self._running = None
            return True

    # -- what a test sees and does --------------------------------------------------------

    @property
    def term(self) -> Term | None:
        """The term whose jobs are running, or None."""
        with self._lock:
            return None if self._running is None else self._running[0]

    @property
    def hooks(self) -> LeaderHooks:
        with self._lock:
            assert self._running is not None, "no term's jobs are running"
            return self._running[1]

    @property
    def health(self) -> NodeHealth:
        """The node's health record, as the running jobs see it."""
        return self.hooks.health

    def report_write(self) -> None:
        term = self.term
        assert term is not None, "no term's jobs are running"
        assert term.may_write(), "a write commits only while the term may write"
        self.hooks.health.write_succeeded()

    def report_fenced(self) -> None:
        self.hooks.on_fenced(FencedError("fenced: token does not hold the fence (fake)"))

    def report_fatal(self, exc: AllocatorError) -> None:
        self.hooks.on_fatal(exc)


class FakeMonotonic:
    """Monotonic seconds that pass only by :meth:`advance` (thread-safe)."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self._lock = threading.Lock()
        self._now = start_s

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a monotonic clock does not go back"
        with self._lock:
            self._now += seconds

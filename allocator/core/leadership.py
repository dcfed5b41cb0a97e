"""Who may write, decided conservatively: the session guard and the leader's term.

Rules (DESIGN §2 I6, §4; River's leadership doc and kazoo's ``KazooState`` docs):
- Trust is earned, never assumed: a node may write only while (1) it holds a term, i.e. it
  is first in the election AND its fence takeover committed, and (2) its ZooKeeper session
  is CONNECTED. Both are checked by :meth:`Term.may_write`, which every write path calls
  before it starts AND again right before it commits.
- SUSPENDED (connection lost, session maybe alive) withdraws trust at once, from the kazoo
  listener itself (setting an Event never blocks). In-flight writes are abandoned: their
  commit-time check fails and they roll back.
- kazoo reports LOST only after reconnecting; a node cut off from every server could stay
  SUSPENDED for ever. The guard's own timer therefore declares the session lost once a
  suspension has lasted the session timeout, whatever kazoo says later.
- A CONNECTED after SUSPENDED restores the session but not trust in the term: the leader
  loop re-checks that its znode still exists and is owned by this session (same token)
  before it resumes writing.
- Listeners run on kazoo's connection thread: they only flip Events; all reactions happen on
  the node's own threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from allocator.fence import Token

log = logging.getLogger(__name__)

CONNECTED = "CONNECTED"
SUSPENDED = "SUSPENDED"
LOST = "LOST"
"""The session states a ZooKeeper client reports (kazoo's ``KazooState`` values are these
strings): the guard takes them without the domain importing kazoo."""


class SessionGuard:
    """Tracks the ZooKeeper session as the node must see it (a kazoo state listener)."""

    def __init__(
        self, session_timeout_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._timeout_s = session_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._lost = threading.Event()
        self._suspended_at: float | None = None
        self.lost_reason = ""
        self.changed = threading.Event()
        """Set on every transition, for loops that wait on the session."""

    # kazoo listener: must not block, must not call ZooKeeper.
    def __call__(self, state: str) -> None:
        with self._lock:
            if state == CONNECTED:
                self._suspended_at = None
                if not self._lost.is_set():
                    self._connected.set()
            elif state == SUSPENDED:
                self._connected.clear()
                if self._suspended_at is None:
                    self._suspended_at = self._clock()
            elif state == LOST:
                self._mark_lost("session expired (kazoo LOST)")
        self.changed.set()

    def check_timer(self) -> bool:
        """Declare the session lost if suspended for a whole session timeout; True if lost."""
        with self._lock:
            if (
                self._suspended_at is not None
                and not self._lost.is_set()
                and self._clock() - self._suspended_at >= self._timeout_s
            ):
                self._mark_lost(
                    f"suspended for {self._timeout_s:.1f} s, the session timeout (own timer)"
                )
                self.changed.set()
        return self._lost.is_set()

    def _mark_lost(self, reason: str) -> None:
        self._connected.clear()
        if not self._lost.is_set():
            self.lost_reason = reason
            self._lost.set()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    @property
    def suspended_for_s(self) -> float | None:
        with self._lock:
            return None if self._suspended_at is None else self._clock() - self._suspended_at

    def reset(self) -> None:
        """Forget a loss: only when the node re-enters the election with a new session."""
        with self._lock:
            self._lost.clear()
            self._suspended_at = None
            self.lost_reason = ""


@dataclass
class Term:
    """One leadership term: the fence token this node took, and whether it may write now."""

    token: Token
    guard: SessionGuard

    @property
    def epoch(self) -> int:
        """The czxid half of the token."""
        return self.token.epoch

    def __post_init__(self) -> None:
        self._active = threading.Event()
        self._ended = threading.Event()
        self.end_reason = ""

    def activate(self) -> None:
        """Called once the fence takeover committed (and again after a verified resume)."""
        if not self._ended.is_set():
            self._active.set()

    def pause(self) -> None:
        """Stop writing (SUSPENDED): cheap, idempotent, safe from any thread."""
        self._active.clear()

    def end(self, reason: str) -> None:
        """The term is over for good; the first reason given is kept."""
        self._active.clear()
        if not self._ended.is_set():
            self.end_reason = reason
            self._ended.set()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def may_write(self) -> bool:
        """True only while the term is active and the session is connected and not lost."""
        return self._active.is_set() and self.guard.connected and not self.guard.lost

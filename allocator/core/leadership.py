"""Who may write, decided conservatively: the session guard and the leader's term.

The rules (I6; trust earned, never assumed; SUSPENDED withdraws it) are docs/design.md §4;
they follow River's leadership doc and kazoo's ``KazooState`` docs.
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
    """Tracks the ZooKeeper session as the node must see it (a kazoo state listener).

    kazoo reports LOST only after reconnecting, so a node cut off from every server could
    stay SUSPENDED for ever: :meth:`check_timer` declares the session lost once a suspension
    has lasted the session timeout, whatever kazoo says later.
    """

    def __init__(
        self, session_timeout_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._configured_s = session_timeout_s
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
        """The kazoo listener, on kazoo's connection thread: it only flips Events, never
        blocks.

        SUSPENDED withdraws trust at once (in-flight writes then fail their commit-time
        check and roll back). A CONNECTED after SUSPENDED restores the session but not trust
        in the term: the leader loop re-checks its znode before it resumes writing. Every
        reaction happens on the node's own threads.
        """
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

    def grant(self, granted_s: float) -> None:
        """The server granted this session ``granted_s``: the own timer fires after the
        smaller of it and the configured timeout, never later than the server expires the
        session (a server clamps the request to its min/max session timeout)."""
        with self._lock:
            self._timeout_s = min(self._configured_s, granted_s)

    @property
    def timeout_s(self) -> float:
        """How long a suspension lasts before the own timer declares the session lost."""
        return self._timeout_s

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
        """True while the session is CONNECTED and has not been declared lost."""
        return self._connected.is_set()

    @property
    def lost(self) -> bool:
        """True once the session was lost (kazoo LOST, or the guard's own timer), until
        :meth:`reset`.
        """
        return self._lost.is_set()

    @property
    def suspended_for_s(self) -> float | None:
        """Seconds since the connection was suspended; None while connected."""
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
        """True once :meth:`end` was called."""
        return self._ended.is_set()

    def may_write(self) -> bool:
        """True only while the term is active and the session is connected and not lost.

        A node holds an active term once it is first in the election and its fence takeover
        committed. Every write path calls this before it starts and again right before it
        commits.
        """
        return self._active.is_set() and self.guard.connected and not self.guard.lost

"""The events the node's threads share, and the role the node shows."""

from __future__ import annotations

import threading
import time


class Signals:
    """The events the node's threads share, and the role the node shows.

    Every collaborator gets this one object at construction; events only flip, so any thread
    (a signal handler, the admin server, kazoo's listener) may set one without blocking.
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        """Asked to stop (SIGTERM, ``request_stop``)."""
        self.closing = threading.Event()
        """The run is over: background threads end."""
        self.interrupt = threading.Event()
        """Wakes a waiting follower or a back-off: a stop or a session loss."""
        self.wake = threading.Event()
        """Wakes the leader's watch loop."""
        self.step_down = threading.Event()
        self.fenced = threading.Event()
        self.role = "starting"
        """starting, follower, blocked, leader or stopping (``/status``)."""
        self.since = time.time()
        """When the node last became leader (or started)."""
        self.asked_at: float | None = None
        """When a stop or a step-down was last asked (monotonic): a handover's profile
        starts there."""

    def ask(self, event: threading.Event, at: float | None = None) -> None:
        """Set ``stop`` or ``step_down`` and wake the leader's loop, noting when it was asked
        (``at``, monotonic; now when None)."""
        self.asked_at = time.monotonic() if at is None else at
        event.set()
        self.wake.set()

    def pause(self, seconds: float) -> None:
        """A back-off that ends early on a stop request or a session loss."""
        self.interrupt.wait(seconds)

"""Monotonic durations of a handover's steps, logged as one event (docs/capacity.md's
handover profile comes from these events)."""

from __future__ import annotations

import time

from allocator.core import logs

log = logs.get_logger(__name__)


class StepClock:
    """Laps of one path (a term's end, a takeover): each step's milliseconds since the step
    before, and the total since ``started`` (a monotonic time; now when None)."""

    def __init__(self, started: float | None = None) -> None:
        self._started = time.monotonic() if started is None else started
        self._last = self._started
        self._laps: dict[str, float] = {}

    def lap(self, step: str) -> None:
        """``step`` ended now."""
        now = time.monotonic()
        self._laps[f"{step}_ms"] = round((now - self._last) * 1000, 1)
        self._last = now

    def log(self, event: str, **fields: object) -> None:
        """One event with every lap and ``total_ms``."""
        total = round((self._last - self._started) * 1000, 1)
        log.info(event, **fields, **self._laps, total_ms=total)

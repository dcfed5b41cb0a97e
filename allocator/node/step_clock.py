"""Monotonic durations of a handover's steps, for one event (``term_end_steps``,
``takeover_steps``: docs/drills.md, "Where a handover's time goes")."""

from __future__ import annotations

import time


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

    def fields(self) -> dict[str, float]:
        """Every lap (``<step>_ms``) and ``total_ms``: an event's fields."""
        return {**self._laps, "total_ms": round((self._last - self._started) * 1000, 1)}

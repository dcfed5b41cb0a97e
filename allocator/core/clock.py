"""The wall clock, in Unix milliseconds: what a node cuts IDs by (tests pass another)."""

from __future__ import annotations

import time


def wall_clock_ms() -> int:
    """The wall clock now, in Unix milliseconds."""
    return time.time_ns() // 1_000_000

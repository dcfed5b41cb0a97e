"""A handover's profile: each step's milliseconds since the one before, and the total."""

from __future__ import annotations

import time

from allocator.node.step_clock import StepClock


def test_laps_add_up_to_the_total_from_the_start_given() -> None:
    steps = StepClock(time.monotonic() - 0.05)  # started 50 ms ago (a stop asked then)
    steps.lap("noticed")
    steps.lap("znode_deleted")
    fields = steps.fields()
    assert list(fields) == ["noticed_ms", "znode_deleted_ms", "total_ms"]
    assert fields["noticed_ms"] >= 50
    assert fields["znode_deleted_ms"] >= 0
    assert abs(fields["noticed_ms"] + fields["znode_deleted_ms"] - fields["total_ms"]) <= 0.2

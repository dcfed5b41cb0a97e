"""A handover's profile: each step's milliseconds since the one before, and the total."""

from __future__ import annotations

import logging
import time

import pytest

from allocator.core import logs
from allocator.node.step_clock import StepClock


def test_laps_add_up_to_the_total_from_the_start_given(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="allocator.node.step_clock")
    steps = StepClock(time.monotonic() - 0.05)  # started 50 ms ago (a stop asked then)
    steps.lap("noticed")
    steps.lap("znode_deleted")
    steps.log("term_end_steps", name="n")
    (record,) = caplog.records
    fields = getattr(record, logs.FIELDS_ATTR)
    assert fields["event"] == "term_end_steps"
    assert fields["name"] == "n"
    assert fields["noticed_ms"] >= 50
    assert fields["znode_deleted_ms"] >= 0
    assert abs(fields["noticed_ms"] + fields["znode_deleted_ms"] - fields["total_ms"]) <= 0.2

"""The mark a reset after a restore moves to (:mod:`allocator.pool.restore_mark`): the floor passed
to ``reset_after_restore``, the lead, and which candidate wins (no servers)."""

from __future__ import annotations

from allocator.fence import WATERMARK_INTERVAL_S
from allocator.pool.restore_mark import WATERMARK_LAG_MS, MarkPlan


def plan(*, watermark: int | None, old: int | None, clock: int | None) -> MarkPlan:
    return MarkPlan(
        restored_database=100,
        watermark=watermark,
        old_database=old,
        restored_clock=clock,
        max_clock_ahead_ms=1000,
    )


def test_the_lead_adds_the_watermarks_lag_to_the_allowed_clock_lead() -> None:
    assert WATERMARK_LAG_MS == WATERMARK_INTERVAL_S * 1000
    assert plan(watermark=None, old=None, clock=None).lead_ms == 1000 + WATERMARK_LAG_MS


def test_the_floor_is_the_larger_of_the_watermark_and_the_old_databases_mark() -> None:
    assert plan(watermark=500, old=700, clock=900).floor == 700
    assert plan(watermark=500, old=None, clock=900).floor == 500
    assert plan(watermark=None, old=None, clock=900).floor == -1


def test_the_largest_candidate_wins_and_the_reset_has_the_last_word() -> None:
    assert plan(watermark=500, old=7000, clock=900).winner() == "old_database"
    assert plan(watermark=5000, old=None, clock=900).winner() == "watermark"
    # The reset computes the clock again, later: a mark above every planned value is its.
    assert plan(watermark=5000, old=None, clock=900).winner(new_mark=5001) == "restored_clock"
    assert plan(watermark=5000, old=None, clock=900).winner(new_mark=5000) == "watermark"
    assert plan(watermark=None, old=None, clock=None).winner() == "restored_database"
    lines = plan(watermark=None, old=None, clock=900).lines()
    assert "not read (--old-database-unreachable)" in lines[2]
    assert lines[3].endswith("<- the mark")

"""Pure parts of the drill: percentiles and the consumers' duplicate check."""

from __future__ import annotations

import pytest

from allocator.drill import check_records, percentile, summarize


@pytest.mark.parametrize(("p", "expected"), [(50, 10.0), (90, 18.0), (99, 20.0), (100, 20.0)])
def test_nearest_rank_percentiles(p: float, expected: float) -> None:
    assert percentile([float(v) for v in range(20, 0, -1)], p) == expected


def test_summary_of_nothing_is_null() -> None:
    assert summarize([]) == {"p50": None, "p90": None, "p99": None, "max": None}


def test_clean_records_have_no_violation() -> None:
    assert check_records([(1, 0, 9, "a"), (2, 10, 19, "b")]) == []


def test_a_block_claimed_twice_and_overlapping_ids_are_caught() -> None:
    found = {v.check for v in check_records([(1, 0, 9, "a"), (1, 0, 9, "b"), (2, 5, 14, "c")])}
    assert found == {"block_claimed_twice", "ids_handed_out_twice"}

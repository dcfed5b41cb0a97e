"""Pure parts of the drill: percentiles (the verdict is :mod:`allocator.verify`'s, tested in
test_verify)."""

from __future__ import annotations

import pytest

from allocator.drill import percentile, summarize


@pytest.mark.parametrize(("p", "expected"), [(50, 10.0), (90, 18.0), (99, 20.0), (100, 20.0)])
def test_nearest_rank_percentiles(p: float, expected: float) -> None:
    assert percentile([float(v) for v in range(20, 0, -1)], p) == expected


def test_summary_of_nothing_is_null() -> None:
    assert summarize([]) == {"p50": None, "p90": None, "p99": None, "max": None}

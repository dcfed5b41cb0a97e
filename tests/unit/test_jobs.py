"""Pure parts of the jobs: the pool target."""

from __future__ import annotations

import pytest

from allocator.config import PoolConfig
from jobs.refill import pool_target


@pytest.mark.parametrize(
    ("rate", "expected"),
    [
        (None, 64),  # no rate observed yet: the minimum
        (0.0, 64),
        (0.5, 64),  # 0.5 blocks/s x 60 s = 30 < min_blocks
        (10.0, 600),  # runway wins
        (10.01, 601),  # rounded up: never less runway than asked
        (1e9, 100_000),  # capped
    ],
)
def test_pool_target_is_min_blocks_or_runway_capped(rate: float | None, expected: int) -> None:
    pool = PoolConfig(min_blocks=64, runway_s=60.0, max_blocks=100_000)
    assert pool_target(pool, rate) == expected

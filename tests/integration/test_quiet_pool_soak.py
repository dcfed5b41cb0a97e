"""What a quiet cluster holds, and what a bound on an ID's age would void (issue 22): a soak,
only with ``ALLOCATOR_SOAK=1``; it prints a table and writes JSON.

One node with the shipped pool settings, one claim a second for ``ALLOCATOR_QUIET_POOL_S``
(default 330 s: the 300 s bound plus half a minute). Every 5 s it records the pool level;
at the end it counts the unclaimed blocks whose first ID is older than the bound
(``pool.max_block_age_s`` = 300 s): what the leader's voiding would have voided by then.
Per hour, in the steady state where every block leaves the pool by a claim or by voiding
within the bound, the pool turns over ``held / bound`` blocks a second, of which the claim
rate is claimed: ``voided_per_hour = 3600 x max(0, held / bound - rate)``.

``ALLOCATOR_QUIET_POOL_JSON`` names the JSON file (default: the test's tmp_path).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.fixtures.nodes import MakeNode, wait_for
from tests.integration.test_cold_burst import readyz

DURATION_S = float(os.environ.get("ALLOCATOR_QUIET_POOL_S", "330"))
pytestmark = [
    pytest.mark.integration,
    pytest.mark.soak,
    pytest.mark.timeout(DURATION_S + 120),  # the run itself, then the node's start and stop
]

BOUND_S = 300.0
RATE_PER_S = 1.0
SAMPLE_EVERY_S = 5.0
PAST_THE_BOUND = (
    "SELECT count(*) FROM allocator.blocks b"
    " WHERE b.claimed_at IS NULL"
    "   AND allocator.id_time_ms(b.first_id) < allocator.db_now_ms() - %s"
)


def test_blocks_held_and_voided_per_hour_at_one_claim_a_second(
    make_node: MakeNode, db_url: str, tmp_path: Path
) -> None:
    duration_s = DURATION_S
    out = Path(os.environ.get("ALLOCATOR_QUIET_POOL_JSON", str(tmp_path / "quiet-pool.json")))
    node = make_node("quiet", fast=False, **{"zookeeper.session_timeout_ms": 2000})
    admin_url = node.admin_url
    wait_for(lambda: readyz(admin_url) == 200, "/readyz to answer ready")

    levels: list[int] = []
    claims = 0
    with psycopg.connect(db_url, autocommit=True) as conn:
        started = time.monotonic()
        next_sample = started
        while (now := time.monotonic()) - started < duration_s:
            conn.execute("SELECT * FROM allocator.claim_blocks('quiet', 1)").fetchall()
            claims += 1
            if now >= next_sample:
                row = conn.execute("SELECT available_blocks FROM allocator.pool_status").fetchone()
                assert row is not None
                levels.append(int(row[0]))
                next_sample += SAMPLE_EVERY_S
            time.sleep(max(0.0, started + claims / RATE_PER_S - time.monotonic()))
        elapsed_s = time.monotonic() - started
        row = conn.execute(PAST_THE_BOUND, (int(BOUND_S * 1000),)).fetchone()
        assert row is not None
        past_bound = int(row[0])

    rate = claims / elapsed_s
    held_mean = sum(levels) / len(levels)
    report: dict[str, Any] = {
        "duration_s": round(elapsed_s, 1),
        "claim_rate_per_s": round(rate, 3),
        "bound_s": BOUND_S,
        "held_blocks_mean": round(held_mean),
        "held_blocks_max": max(levels),
        "past_the_bound_at_end": past_bound,
        "voided_per_hour_steady": round(3600 * max(0.0, held_mean / BOUND_S - rate)),
        "claimed_per_hour": round(3600 * rate),
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    width = max(len(key) for key in report)
    print()
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    print(f"(JSON: {out})")
    assert past_bound > 0 or duration_s < BOUND_S  # the run outlived the bound: something aged

"""A step from idle to 16 connections claiming as fast as they can is carried by the low-water
wake (issue 22): the pool sits at its floor (``pool.min_blocks``), and the low-water check
wakes the refill the moment the burst takes it below ``pool.low_watermark_blocks``
(:mod:`jobs.low_water`). The regular refill is put 100 s away, so every block the burst
gets beyond the floor was cut by a woken refill: the burst, four floors, completes only if
the wake works (with the check slowed to once a minute it cannot).

How many claims find the pool empty meanwhile is a race between 16 claiming threads and the
leader's cutting on a shared machine: a speed, not a behaviour. It was asserted to be 0 here
and CI once saw 404 while the other worker ran a chaos test; it is printed, not asserted.

The floor is scaled to the rate this test can drive: 16 Python threads claim ~3k/s here, a
quarter of the 12.8k/s the shipped 6,144 blocks are sized for, so the test runs with a
quarter of it (and the watermark that follows, two thirds).

The idle spell is short (1 claim/s for a few seconds), but the claim-rate estimator is made
to remember a long one: ``pool_status`` measures the rate from the oldest pool sample of the
last 60 s, so a sample planted 50 s back at the current claim position makes the burst read
as diluted over 50 s of idling, as it would after minutes of it. Without it the estimator
would have seen only the few idle seconds and raised the refill's target within a fraction
of a second: the test would prove the estimator, not the floor and the wake.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from allocator.config import load_config
from tests.fixtures.nodes import MakeNode, wait_for
from tests.fixtures.pg import claim
from tests.integration.test_cold_burst import readyz

pytestmark = pytest.mark.integration

CONNECTIONS = 16
IDLE_CLAIMS = 3  # one a second
REMEMBERED_IDLE_S = 50
SHIPPED_RATE, DRIVEN_RATE = 12_800, 3_200  # claims/s: what the floor is sized for, what runs
POOL_EMPTY = "AL003"
REFILL_INTERVAL_S = 100
"""The regular refill: not within the test (the term's first one runs at once, before it).
The settings that must exceed it follow: ``pool.max_block_age_s`` (2 intervals) and
``leader.db_unreachable_s`` (one interval plus two probes)."""
BURST_DEADLINE_S = 120
EMPTY_PAUSE_S = 0.01
"""A consumer's pause after "pool empty", as a client's backoff would (no hot loop starving
the leader of CPU)."""


def test_a_step_from_idle_to_sixteen_busy_connections_is_carried_by_the_woken_refill(
    make_node: MakeNode, db_url: str
) -> None:
    floor = load_config(None, {}, env={}).pool.min_blocks * DRIVEN_RATE // SHIPPED_RATE
    wanted = 4 * floor
    settings = {
        "zookeeper.session_timeout_ms": 2000,
        "pool.min_blocks": floor,
        "pool.refill_interval_s": REFILL_INTERVAL_S,
        "pool.max_block_age_s": 3 * REFILL_INTERVAL_S,
        "leader.db_unreachable_s": 2 * REFILL_INTERVAL_S,
    }
    node = make_node("step", fast=False, **settings)
    admin_url = node.admin_url
    wait_for(lambda: readyz(admin_url) == 200, "/readyz to answer ready")

    with psycopg.connect(db_url, autocommit=True) as conn:
        for _ in range(IDLE_CLAIMS):
            claim(conn, "idle")
            time.sleep(1)
        conn.execute(
            "INSERT INTO allocator.pool_samples (sampled_at, claim_position, cut_position)"
            " SELECT clock_timestamp() - make_interval(secs => %s), claim_position, cut_position"
            "   FROM allocator.pool_status",
            (REMEMBERED_IDLE_S,),
        )
        (available,) = conn.execute("SELECT available_blocks FROM allocator.pool_status").fetchone()
        assert available <= floor + IDLE_CLAIMS  # at the floor: nothing sized it up before

    claimed = [0] * CONNECTIONS
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(CONNECTIONS)

    def consumer(index: int) -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            start.wait()
            deadline = time.monotonic() + BURST_DEADLINE_S
            while sum(claimed) < wanted and time.monotonic() < deadline:
                try:
                    claimed[index] += len(claim(conn, f"step-{index}"))
                except psycopg.Error as exc:
                    with lock:
                        errors.append(exc.sqlstate or repr(exc))
                    time.sleep(EMPTY_PAUSE_S)

    threads = [threading.Thread(target=consumer, args=(i,)) for i in range(CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    empty = errors.count(POOL_EMPTY)
    print(f"{empty} claims found the pool empty during the step")  # a figure, not a rule
    assert sum(claimed) >= wanted, (
        f"the burst got {sum(claimed)} of {wanted} blocks in {BURST_DEADLINE_S} s: the refill "
        f"was not woken (errors: {sorted(set(errors))})"
    )
    assert [e for e in errors if e != POOL_EMPTY] == []

"""Chaos: the proof that the checker can fail. A leader without the fence must be caught.

Rules: the node under test is built in tests/ through the node's seams
(:mod:`tests.chaos.unsafe_node`; the product has no switch for it): its ``may_write``
ignores the session and the end of its term, and it writes blocks by a plain INSERT as
superuser, bypassing ``cut_blocks``' fence. The
scenario is the SIGSTOP one (``test_node_faults``); this time the checker MUST report stale
writes (I3). If it did not, its silence in every other scenario would prove nothing.

The checker judges stale writes by order (:mod:`allocator.core.verify`): a block of the old token
after a block of the new one. So the correct successor must have written before the unfenced
node runs on: the test drains the pool (claims nobody records, which the checker allows) so
the successor refills, and only then lets the unfenced node resume.
"""

from __future__ import annotations

import signal

import psycopg
import pytest

from allocator.node import EXIT_SESSION_LOST
from tests.chaos.harness import (
    UNSAFE_NODE_COMMAND,
    ChaosCluster,
    chaos_consumers,
    log_events,
    now_utc,
    wait_for,
)
from tests.chaos.test_clock_skew import LIBFAKETIME, faketime_env

pytestmark = pytest.mark.integration

# The supervised (correct) nodes aim for at most 1000 blocks, the unsafe one for 3000: the
# unsafe node always finds the pool short and writes, the correct one writes once the test
# drained the pool below DRAINED_BELOW, then never needs to while the pool holds more than
# 1000, so the stale writes come after the successor's and do not collide with them.
CORRECT_NODES_ENV = {"ALLOCATOR_POOL_MAX_BLOCKS": "1000"}
DRAINED_BELOW = 500
DRAIN_CALLS = 10
UNSAFE_ENV = {
    "ALLOCATOR_POOL_MIN_BLOCKS": "3000",
    "ALLOCATOR_POOL_MAX_BLOCKS": "3000",
    "ALLOCATOR_NODE_ON_SESSION_LOSS": "exit",  # its end is the proof's clock: exit 3
}


def drain(url: str, chaos: ChaosCluster) -> None:
    """Claim (unrecorded) until the pool is below what the correct nodes aim for."""
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(DRAIN_CALLS):
            if chaos.available_blocks() < DRAINED_BELOW:
                return
            conn.execute("SELECT count(*) FROM allocator.claim_blocks('chaos-drain', 1000)")
    raise AssertionError(f"the pool stayed at {chaos.available_blocks()} blocks")


def test_checker_catches_a_leader_that_writes_without_the_fence() -> None:
    """Breaks: the fence itself. An unfenced leader is paused (SIGSTOP) past its session
    timeout, a correct node takes over, then the unfenced one runs on (SIGCONT) and writes.

    Must hold: the checker reports at least one I3 violation (a block of the old epoch cut
    after a block of its successor's), i.e. it catches a dual master. Cost: ~12 s.
    """
    with ChaosCluster(zk=1, nodes=0, node_env=CORRECT_NODES_ENV) as chaos:
        unsafe = chaos.start_extra_node(
            "unsafe", UNSAFE_ENV, database_url=chaos.database_url, command=UNSAFE_NODE_COMMAND
        )
        old = chaos.wait_leader()
        assert old.name == "unsafe"
        chaos.wait_pool(2000)
        info = chaos.up(nodes=2)
        for node in info.nodes:
            chaos.wait_role(node.admin_url, "follower", f"{node.name} to queue behind it")
        consumers = chaos_consumers(info.consumer_database_url).start()
        try:
            wait_for(lambda: consumers.count() >= 20, "claims before the fault")
            unsafe.signal(signal.SIGSTOP)
            paused_at = now_utc()
            new = chaos.wait_leader(newer_than=old.epoch)
            assert new.name != "unsafe"
            drain(info.consumer_database_url, chaos)
            chaos.wait_cutting(new.epoch, after=paused_at)
            unsafe.signal(signal.SIGCONT)
            wait_for(
                lambda: chaos.blocks_cut(epoch=old.epoch, after=paused_at),
                "the unfenced node to write after losing its term",
            )
            wait_for(lambda: unsafe.exit_code is not None, "the unfenced node to exit")
            records = consumers.stop()
        finally:
            consumers.stop()
        assert unsafe.exit_code == EXIT_SESSION_LOST
        assert log_events(unsafe.log_path, "unsafe_unfenced_write")
        violations = chaos.check(records)
        stale = [v for v in violations if v.invariant == "I3" and "stale write" in v.message]
        assert stale, f"the checker missed the unfenced writes: {violations}"


@pytest.mark.skipif(not LIBFAKETIME.exists(), reason="Debian package faketime not installed")
def test_checker_catches_a_leader_that_moves_the_mark_ahead_of_the_database_clock() -> None:
    """Breaks: the clock rule. An unfenced node under libfaketime (+1 h) that lies about its
    clock agreeing cuts blocks an hour ahead, bypassing ``cut_blocks``' check.

    Must hold: the checker reports I5 "past the database clock" (what ``cut_blocks``
    forbids in the product, docs/design.md §11). Cost: ~4 s.
    """
    with ChaosCluster(zk=1, nodes=0) as chaos:
        ahead = chaos.start_extra_node(
            "ahead",
            faketime_env("+1h"),
            database_url=chaos.database_url,
            command=(*UNSAFE_NODE_COMMAND, "--ignore-clock"),
        )
        leader = chaos.wait_leader()
        assert leader.name == "ahead"
        wait_for(lambda: chaos.blocks_cut(epoch=leader.epoch), "the skewed node to cut")
        violations = chaos.check([])
        ahead.stop()
    late = [v for v in violations if v.invariant == "I5" and "past the database" in v.message]
    assert late, f"the checker missed blocks an hour ahead: {violations}"

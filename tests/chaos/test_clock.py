"""Chaos: a new leader whose clock is a minute behind the cluster's high-water mark.

Rules: the late node runs outside the supervisor (the supervisor gives every node the
same environment) with the test hook ``ALLOCATOR_TEST_CLOCK_OFFSET_MS=-60000``, which
shifts only its clock; the test stops it by pid. The checker (I1-I5) finds nothing.
"""

from __future__ import annotations

import time

import pytest

from tests.chaos.harness import (
    ChaosCluster,
    Consumers,
    log_events,
    metric,
    wait_for,
)

pytestmark = pytest.mark.integration

CLAIMS = 20
LATE_ENV = {"ALLOCATOR_TEST_CLOCK_OFFSET_MS": "-60000"}


def test_leader_with_a_clock_behind_the_mark_refuses_to_cut_and_the_pool_keeps_serving() -> None:
    """Breaks: time. The leader hands over (graceful stop) to a node whose clock says one
    minute ago, so every block it could cut would carry a timestamp behind the mark.

    Must hold: the late node takes the fence but cuts nothing (refuses: its
    ``allocator_clock_behind_alert`` is 1, it logs ``clock_behind``); consumers keep
    claiming from the pool already cut; the mark does not move; no violation. Cost: ~4 s.
    """
    with ChaosCluster(zk=1, nodes=1) as chaos:
        first = chaos.wait_leader()
        late = chaos.start_extra_node("late", LATE_ENV)
        chaos.wait_role(late.admin_url, "follower", "the late node to queue")
        consumers = Consumers(chaos.info().consumer_database_url).start()
        try:
            wait_for(lambda: consumers.count() >= CLAIMS, "claims before the handover")
            chaos.wait_pool(800)  # enough for the rest of the test: nobody refills it
            cut_before = chaos.blocks_cut()
            chaos.cluster.stop_node(first.name)  # SIGTERM: hands over at once
            new = chaos.wait_leader(newer_than=first.epoch)
            assert new.name == "late"
            wait_for(
                lambda: metric(late.admin_url, "allocator_clock_behind_alert") == 1,
                "the clock-behind alert on the late leader",
            )
            since = time.time()
            wait_for(lambda: consumers.count(since=since) >= CLAIMS, "claims from the pool")
            chaos.assert_clean(consumers)
        finally:
            consumers.stop()
        assert chaos.blocks_cut(epoch=new.epoch) == 0
        assert chaos.blocks_cut() == cut_before
        assert log_events(late.log_path, "clock_behind")
        assert log_events(late.log_path, "test_hook_enabled")
        assert late.stop() == 0

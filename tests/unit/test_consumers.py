"""The consumer recorder (:mod:`allocator.drill.consumers`) without a server: counters, bounds and
errors by kind. Its claims against a real database are exercised by the demo, the drill and
every chaos scenario."""

from __future__ import annotations

import time

import pytest

from allocator.drill.consumers import MAX_EXAMPLES, Consumers, ConsumerStats, named
from allocator.local.tcp_ports import LOOPBACK, pick_free_ports


def test_named_consumers() -> None:
    assert named("drill-consumer", 2) == {"drill-consumer-1": 1, "drill-consumer-2": 1}
    assert named("c", 1, blocks=3) == {"c-1": 3}


def test_stats_add_up_and_tell_what_happened_since() -> None:
    before = ConsumerStats(10, 12, 1, 1, {"57P01": 1}, ["a: 57P01 terminating"])
    now = ConsumerStats(
        25, 30, 2, 4, {"57P01": 2, "OperationalError": 2}, ["a: 57P01 terminating", "b: x"]
    )
    assert now.since(before) == ConsumerStats(
        15, 18, 1, 3, {"57P01": 1, "OperationalError": 2}, ["b: x"]
    )
    total = ConsumerStats()
    total.add(before)
    total.add(now)
    assert (total.claims, total.calls, total.pool_empty, total.errors) == (35, 42, 3, 5)
    assert total.error_kinds == {"57P01": 3, "OperationalError": 2}


def test_no_consumer_or_no_block_per_call_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one consumer"):
        Consumers("postgresql:///x", {})
    with pytest.raises(ValueError, match="at least one block"):
        Consumers("postgresql:///x", {"c": 0})


def test_errors_never_stop_a_consumer_and_count_by_kind_within_the_claim_budget() -> None:
    port = pick_free_ports(1)[0]  # nothing listens there: every connection is refused
    url = f"postgresql://nobody@{LOOPBACK}:{port}/nothing"
    with Consumers(url, named("c", 2), pause_s=0.001, max_calls=3) as consumers:
        deadline = time.monotonic() + 10.0
        while consumers.totals().calls < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert consumers.records() == []
    totals = consumers.totals()
    assert (totals.calls, totals.errors, totals.claims, totals.pool_empty) == (6, 6, 0, 0)
    assert totals.error_kinds == {"OperationalError": 6}
    assert len(totals.error_examples) == MAX_EXAMPLES  # the first few, not all
    assert all(
        e.startswith(("c-1: OperationalError", "c-2: OperationalError"))
        for e in totals.error_examples
    )
    assert "c-1: 0 blocks, 0 pool-empty, 3 errors" in consumers.describe()

"""Every node's reading of the pool: metrics that do not depend on the leader, readiness with
hysteresis, a reading per sample interval once ready (no servers)."""

from __future__ import annotations

import math

import pytest
from prometheus_client import generate_latest

from allocator.config import Config
from allocator.core.errors import DatabaseUnavailableError
from allocator.core.records import PoolStatus
from allocator.metrics import NodeMetrics
from allocator.node.pool_watch import PoolWatch

FLOOR = 100


class Pool:
    """A pool_status reader whose answer the test sets."""

    def __init__(self) -> None:
        self.available = 0
        self.rate: float | None = None
        self.reads = 0
        self.down = False

    def pool_status(self) -> PoolStatus:
        self.reads += 1
        if self.down:
            raise DatabaseUnavailableError("read the pool status: unreachable (test)")
        runway = self.available / self.rate if self.rate else None
        return PoolStatus(
            available_blocks=self.available,
            available_ids=self.available * 4096,
            claim_rate_blocks_per_s=self.rate,
            runway_s=runway,
            high_water_id=-1,
            cut_position=0,
            claim_position=0,
            epoch=0,
            holder=None,
        )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def parts() -> tuple[Pool, Clock, NodeMetrics, PoolWatch]:
    config = Config.model_validate(
        {
            "pool": {"min_blocks": FLOOR, "sample_interval_s": 5.0},
            "zookeeper": {"session_timeout_ms": 4000},
        }
    )
    pool, clock, metrics = Pool(), Clock(), NodeMetrics()
    return pool, clock, metrics, PoolWatch(pool, config, metrics, clock=clock)


def test_pool_metrics_are_no_value_until_read_then_this_nodes_own_reading(
    parts: tuple[Pool, Clock, NodeMetrics, PoolWatch],
) -> None:
    pool, _clock, metrics, watch = parts
    text = generate_latest(metrics.registry).decode()
    assert "allocator_pool_available_blocks NaN" in text  # a follower never exports a made-up 0
    assert "allocator_pool_runway_needed_seconds 9.0" in text  # 4 s session + 5 s margin
    pool.available = 250
    watch.read()
    text = generate_latest(metrics.registry).decode()
    assert "allocator_pool_available_blocks 250.0" in text
    assert "allocator_pool_runway_seconds +Inf" in text  # nothing claimed: unbounded
    pool.rate = 50.0
    watch.read()
    assert metrics.pool_runway_seconds._value.get() == 5.0
    assert metrics.pool_claim_rate._value.get() == 50.0


def test_ready_once_the_pool_reaches_the_floor_and_until_it_runs_empty(
    parts: tuple[Pool, Clock, NodeMetrics, PoolWatch],
) -> None:
    pool, _clock, _metrics, watch = parts
    pool.available = FLOOR - 1
    watch.read()
    assert not watch.pool_ready
    pool.available = FLOOR
    watch.read()
    assert watch.pool_ready
    pool.available = 1  # drawn below the floor between refills: still ready
    watch.read()
    assert watch.pool_ready
    pool.available = 0
    watch.read()
    assert not watch.pool_ready
    pool.available = FLOOR // 2  # refilling, not back at the floor yet
    watch.read()
    assert not watch.pool_ready


def test_reads_on_every_probe_until_ready_then_once_per_sample_interval(
    parts: tuple[Pool, Clock, NodeMetrics, PoolWatch],
) -> None:
    pool, clock, _metrics, watch = parts
    watch.maybe_read()
    watch.maybe_read()
    assert pool.reads == 2  # not ready: every probe
    pool.available = FLOOR
    watch.maybe_read()
    assert watch.pool_ready
    reads = pool.reads
    clock.now += 4.9
    watch.maybe_read()
    assert pool.reads == reads
    clock.now += 0.1
    watch.maybe_read()
    assert pool.reads == reads + 1


def test_a_failed_reading_keeps_the_last_one(
    parts: tuple[Pool, Clock, NodeMetrics, PoolWatch],
) -> None:
    pool, _clock, metrics, watch = parts
    pool.available = FLOOR
    watch.read()
    pool.down = True
    assert watch.read() is None
    assert watch.pool_ready
    assert watch.last is not None
    assert watch.last.available_blocks == FLOOR
    assert not math.isnan(metrics.pool_available_blocks._value.get())


def test_an_ex_leader_exports_no_stale_leader_alert() -> None:
    metrics = NodeMetrics()
    for gauge in (metrics.is_leader, metrics.clock_behind, metrics.mark_ahead_seconds):
        gauge.set(1)
    metrics.leadership_ended()
    text = generate_latest(metrics.registry).decode()
    assert "allocator_is_leader 0.0" in text
    assert "allocator_clock_behind_alert 0.0" in text
    assert "allocator_mark_ahead_seconds 0.0" in text
    assert 'allocator_build_info{python="' in text

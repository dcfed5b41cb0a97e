"""The results of ``allocator bench client``: one throughput run, and the latency run.

Plain data, written to the JSON as they are (``dataclasses.asdict``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ThroughputResult:
    """One throughput run: threads sharing one client for the run's seconds."""

    threads: int
    ids: int
    seconds: float
    ids_per_s: float
    claims: int
    waits: int
    wait_timeouts: int
    unused_ids: int
    final_batch_blocks: int
    max_claim_ms: float
    errors: list[str] = field(default_factory=list)


@dataclass
class LatencyResult:
    """The latency run: every ``next_id()`` of one thread timed, and the noise floor."""

    calls: int
    p50_ns: int
    p99_ns: int
    p999_ns: int
    max_ns: int
    over_1ms: int
    block_boundaries: int
    boundary_max_ns: int
    segment_boundaries: int
    segment_boundary_max_ns: int
    slowest_ns: list[int]
    timer_overhead_ns: int
    waits: int
    claims: int
    unused_ids: int
    final_batch_blocks: int
    max_claim_ms: float
    noise_floor: dict[str, Any]
    """The same loop timing a no-op function: what the machine alone does to a call."""
    errors: list[str] = field(default_factory=list)
    claims_on_caller_thread: int = 0
    """Prefetches sent and collected on the timed thread (no claimer thread involved)."""
    claims_handed_over: int = 0
    """Prefetches whose answer came late: the claimer thread waited for them."""
    over_1ms_sending_prefetch: int = 0
    """Calls over 1 ms during which the client sent a prefetch claim (``begin``)."""
    over_1ms_collecting_prefetch: int = 0
    """Calls over 1 ms during which the client collected a prefetch's answer (``poll``)."""

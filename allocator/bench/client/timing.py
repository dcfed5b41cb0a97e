"""How the client bench times calls: a tight loop, an exact histogram, the slow calls kept;
percentiles are nearest-rank.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocator.core.errors import AllocatorError

CHUNK_CALLS = 4096
"""Calls between two clock reads in the loops (the clock is read outside the timed calls)."""
HISTOGRAM_LIMIT_NS = 100_000
SLOW_CALL_NS = 1_000_000
TOP_SLOWEST = 10


def timer_overhead_ns() -> int:
    """The median cost of two back-to-back clock reads, what each timed call includes."""
    clock = time.perf_counter_ns
    samples = []
    for _ in range(10_001):
        t0 = clock()
        samples.append(clock() - t0)
    samples.sort()
    return samples[len(samples) // 2]


@dataclass
class Samples:
    """Every timed call: exact below HISTOGRAM_LIMIT_NS, each slower one kept."""

    histogram: list[int] = field(default_factory=lambda: [0] * HISTOGRAM_LIMIT_NS)
    slow: list[int] = field(default_factory=list)
    boundary_ns: list[int] = field(default_factory=list)
    segment_ns: list[int] = field(default_factory=list)
    slow_spans: list[tuple[int, int]] = field(default_factory=list)
    """``(start_ns, took_ns)`` of every call over :data:`SLOW_CALL_NS`."""
    errors: list[str] = field(default_factory=list)

    def slow_containing(self, instants_ns: Sequence[int]) -> int:
        """How many calls over :data:`SLOW_CALL_NS` contain one of ``instants_ns``."""
        return sum(
            1
            for start, took in self.slow_spans
            if any(start <= at <= start + took for at in instants_ns)
        )

    @property
    def calls(self) -> int:
        return sum(self.histogram) + len(self.slow)

    def summary(self) -> dict[str, Any]:
        """Calls, nearest-rank percentiles, calls over 1 ms and the slowest calls."""
        calls, histogram, slow = self.calls, self.histogram, sorted(self.slow)
        return {
            "calls": calls,
            "p50_ns": percentile(histogram, slow, calls, 0.50),
            "p99_ns": percentile(histogram, slow, calls, 0.99),
            "p999_ns": percentile(histogram, slow, calls, 0.999),
            "max_ns": percentile(histogram, slow, calls, 1.0),
            "over_1ms": sum(1 for took in slow if took > SLOW_CALL_NS),
            "slowest_ns": slow[-TOP_SLOWEST:][::-1],
        }


def time_calls(
    call: Callable[[], int],
    seconds: float,
    block_starts: set[int] | frozenset[int] = frozenset(),
    segment_starts: set[int] | frozenset[int] = frozenset(),
) -> Samples:
    """Time every ``call()`` for ``seconds``; note the calls that returned a block's or a
    segment's first ID (the sets fill up as the claimer claims).

    ``perf_counter_ns`` is read around every call and, between chunks of
    :data:`CHUNK_CALLS` calls, outside them (for the deadline). Every sample includes the
    timer's own cost, measured apart by :func:`timer_overhead_ns`."""
    samples = Samples()
    histogram, slow = samples.histogram, samples.slow
    clock = time.perf_counter_ns
    stop = clock() + int(seconds * 1e9)
    try:
        while clock() < stop:
            for _ in range(CHUNK_CALLS):
                t0 = clock()
                value = call()
                took = clock() - t0
                if took < HISTOGRAM_LIMIT_NS:
                    histogram[took] += 1
                else:
                    slow.append(took)
                    if took > SLOW_CALL_NS:
                        samples.slow_spans.append((t0, took))
                if value in block_starts:
                    samples.boundary_ns.append(took)
                    if value in segment_starts:
                        samples.segment_ns.append(took)
    except AllocatorError as exc:
        samples.errors.append(f"{type(exc).__name__}: {exc}")
    return samples


def no_op() -> int:
    """What the noise floor times in place of ``next_id()``."""
    return -1


def percentile(histogram: list[int], slow: list[int], calls: int, q: float) -> int:
    """The smallest sample with at least ``q`` of all samples at or below it."""
    if calls == 0:
        return 0
    rank = max(1, min(calls, math.ceil(q * calls)))
    seen = 0
    for took, count in enumerate(histogram):
        seen += count
        if seen >= rank:
            return took
    return slow[rank - seen - 1]  # ``slow`` sorted

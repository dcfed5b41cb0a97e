"""What ``allocator bench client`` reports: the JSON document and the table.

The JSON holds the run's settings, every throughput run, the latency run (with its
noise floor) and the machine; the table shows the same. Timings are reported, never judged.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from allocator.bench.client.results import LatencyResult, ThroughputResult


def document(
    results: list[ThroughputResult],
    latency: LatencyResult,
    *,
    database: str,
    cluster: dict[str, Any],
    seconds: float,
    batch: tuple[int, int],
    refill_at: float,
    block_sizes: set[int],
    machine: dict[str, Any],
) -> dict[str, Any]:
    """The run's JSON (``database``: ``url`` or ``embedded``)."""
    return {
        "database": database,
        "cluster": cluster,
        "seconds": seconds,
        "batch_blocks": batch[0],
        "max_batch_blocks": batch[1],
        "refill_at": refill_at,
        "block_sizes": sorted(block_sizes),
        "results": [asdict(r) for r in results],
        "latency": asdict(latency),
        "machine": machine,
    }


def table(
    document: dict[str, Any], results: list[ThroughputResult], latency: LatencyResult
) -> Iterator[str]:
    """The table's lines: the settings, each throughput run, the latency run and its floor."""
    sizes = "/".join(str(size) for size in document["block_sizes"]) or "?"
    load = document["machine"]["loadavg_before"][0]
    yield (
        "allocator bench client: a BURST per process (IDs handed out from memory, prefetch "
        "claims from the cluster's pool): a cluster sustains no more than its leader cuts"
    )
    yield (
        f"{document['seconds']:g} s per run, {document['batch_blocks']} "
        f"blocks x {sizes} IDs per claim, refill at {document['refill_at']:g}, "
        f"{document['machine']['cpus']} CPUs, load {load:.2f}"
    )
    yield ""
    yield (
        f"{'threads':>7}  {'IDs':>12}  {'IDs/s':>12}  {'claims':>6}  {'waits':>5}  "
        f"{'batch':>5}  {'max claim':>9}  errors"
    )
    for r in results:
        yield (
            f"{r.threads:>7}  {r.ids:>12,}  {r.ids_per_s:>12,.0f}  {r.claims:>6}  "
            f"{r.waits:>5}  {r.final_batch_blocks:>5}  {r.max_claim_ms:>6.1f} ms  {len(r.errors)}"
        )
    yield ""
    lat = latency
    yield (
        f"next_id() latency, 1 thread, {lat.calls:,} calls timed "
        f"(timer overhead ~{lat.timer_overhead_ns} ns included)"
    )
    yield (
        f"  p50 {lat.p50_ns:,} ns   p99 {lat.p99_ns:,} ns   p99.9 {lat.p999_ns:,} ns   "
        f"max {lat.max_ns:,} ns"
    )
    yield (
        f"  calls over 1 ms: {lat.over_1ms} ({lat.over_1ms_sending_prefetch} sent a prefetch, "
        f"{lat.over_1ms_collecting_prefetch} collected one)   waits (nothing buffered): "
        f"{lat.waits}   "
        f"claims: {lat.claims} (max {lat.max_claim_ms:.1f} ms, final batch "
        f"{lat.final_batch_blocks} blocks)"
    )
    yield (
        f"  prefetches on the calling thread: {lat.claims_on_caller_thread}   handed over to "
        f"the claimer thread: {lat.claims_handed_over}"
    )
    yield (
        f"  worst at a block boundary: {lat.boundary_max_ns:,} ns "
        f"({lat.block_boundaries} boundaries); at a segment hand-over: "
        f"{lat.segment_boundary_max_ns:,} ns "
        f"({lat.segment_boundaries} segments)"
    )
    yield "  slowest calls (ns): " + ", ".join(f"{took:,}" for took in lat.slowest_ns[:5])
    floor = lat.noise_floor
    yield (
        f"noise floor (a no-op timed the same way, {floor['calls']:,} calls): "
        f"p99.9 {floor['p999_ns']:,} ns   max {floor['max_ns']:,} ns   "
        f"calls over 1 ms: {floor['over_1ms']}"
    )

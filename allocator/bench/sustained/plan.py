"""What one ``allocator bench sustained`` run does (:class:`Plan`)."""

from __future__ import annotations

from dataclasses import dataclass

NODES = 3
"""The cluster measured: one leader cutting, two followers probing."""


@dataclass(frozen=True)
class Plan:
    """Every client count runs sustained for ``seconds``, then (same server, same standby)
    a burst of ``claim_blocks`` and the ``durable_commit`` reference for ``burst_seconds``."""

    clients: tuple[int, ...] = (1, 8, 32)
    seconds: float = 60.0
    burst_seconds: float = 15.0
    batch: int = 1
    burst: bool = True
    """False: sustained runs only (no template, no burst, no reference, no ratios)."""
    burst_age_bound: bool = True
    """Give each burst clone a bound on an ID's age, so its claims take the path a serving
    cluster's take (False: no bound, ``allocator bench claims``'s fast path)."""
    wait_events_every_s: float = 0.1
    pool_every_s: float = 1.0
    cpu_every_s: float = 0.5

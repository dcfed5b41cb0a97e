"""What one ``allocator bench claims`` run measures (:class:`Plan`) and one row of its
results (:class:`Result`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

AUTO_POOL_CLAIMS_PER_S = 60_000
"""Pool sizing: above any claim rate seen on a 2-core machine (the issue quotes ~44k/s)."""
AUTO_POOL_BATCH_CALLS_PER_S = 25_000
"""Pool sizing for batch > 1: calls/s ceiling of a batched claim (each takes ``batch``)."""


@dataclass(frozen=True)
class Plan:
    """The matrix: every batch x client count x method for ``seconds``, then the
    prior-claims runs at ``prior_clients``."""

    clients: tuple[int, ...]
    seconds: float
    batches: tuple[int, ...]
    prior_claims: int = 0
    prior_clients: tuple[int, ...] = ()
    pool_blocks: int = 0
    """0: sized from the longest run (:func:`auto_pool_blocks`)."""
    age_bound: bool = True
    """A bound on an ID's age in force, as on a serving cluster (False: the unbounded path of
    a database no leader ever served)."""

    def stocked_blocks(self) -> int:
        """Blocks the template holds: the pool, plus what the prior claims take."""
        pool = self.pool_blocks or auto_pool_blocks(self.seconds, max(self.batches))
        return pool + self.prior_claims * max(self.batches if self.prior_claims else (1,))


def auto_pool_blocks(seconds: float, batch: int) -> int:
    """A pool no method should run dry in ``seconds`` at ``batch``: rates above any seen on a
    2-core machine, at least 10,000 blocks."""
    rate = AUTO_POOL_CLAIMS_PER_S if batch == 1 else AUTO_POOL_BATCH_CALLS_PER_S * batch
    return max(10_000, math.ceil(seconds * rate))


@dataclass
class Result:
    """One measured run of one method, a row of the table and of the JSON's results."""

    method: str
    clients: int
    batch: int
    prior_claims: int
    claims: int
    seconds: float
    claims_per_s: float
    ids_per_claim: int
    ids_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    pool_exhausted: bool
    generator_cpu_share: float = 0.0
    """pgbench's own CPU time over the run's CPU capacity (seconds x CPUs): how much of the
    machine the load generator took (well below 1: it was not the bottleneck)."""
    ratio_vs: dict[str, float] = field(default_factory=dict)
    """claim_blocks rows: claims/s over each baseline's at the same clients (and batch;
    nextval always at batch 1)."""
    ids_ratio_vs: dict[str, float] = field(default_factory=dict)
    vs_fresh: float | None = None
    table_stats: dict[str, Any] = field(default_factory=dict)
    prior_stats: dict[str, Any] = field(default_factory=dict)

    def key(self) -> tuple[str, int, int, int]:
        """(method, clients, batch, prior_claims): what makes two rows comparable."""
        return (self.method, self.clients, self.batch, self.prior_claims)

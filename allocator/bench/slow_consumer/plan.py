"""What one ``allocator bench slow-consumer`` run does (:class:`Plan`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

HEAD = "head"
OLD_REVISION = "0003"
"""The functions before held tickets: the requeue floor stops below an open claim."""


@dataclass(frozen=True)
class Plan:
    """What one run does; the measured claims are rounded up to a multiple of the clients."""

    claims: int = 200_000
    window: int = 10_000
    rate: int = 2_000
    """Claims per second, all clients together (pgbench ``-R``)."""
    clients: int = 4
    requeue_every: int = 100
    """Claims between two leader ticks (requeue_stranded, then the refill). The default is 20
    ticks a second at the default rate: 20 times the refill job's pace, for enough samples."""
    status_every_ms: int = 20
    """Milliseconds between two reads of pool_status by the monitoring reader."""
    pool_blocks: int = 5_000
    warmup: int | None = None
    """Claims before the held claim (None: twice ``pool_blocks``), so both windows meet a
    pool of blocks the leader cut during the run, not the stock vacuumed at setup."""
    revisions: tuple[str, ...] = (HEAD, OLD_REVISION)

    def warmup_claims(self) -> int:
        """Claims before the held one: ``warmup``, or twice the pool."""
        return 2 * self.pool_blocks if self.warmup is None else self.warmup

    def per_client(self) -> int:
        return math.ceil(self.claims / self.clients)

    def total_claims(self) -> int:
        return self.per_client() * self.clients

    def window_claims(self) -> int:
        """At most half the claims, so the first and last windows never overlap."""
        return max(1, min(self.window, self.total_claims() // 2))

    def tick_s(self) -> float:
        """Seconds between two leader ticks: ``requeue_every`` claims at ``rate``."""
        return self.requeue_every / self.rate

"""Pool sampling: record the ticket positions for the claim rate and hand the reading to the
node (its pool gauges and readiness). Waking the refill when the pool runs low is the
low-water check's job (:mod:`jobs.low_water`), which reads the pool far more often.

Rules: the sample is not a block write (it fences nothing), but only the leader samples so
the rate is not counted twice; it never waits on ``busy`` (refill may hold it).
"""

from __future__ import annotations

from allocator.core import logs
from allocator.core.errors import DatabaseUnavailableError
from jobs.context import LeaderContext

log = logs.get_logger(__name__)


def run(ctx: LeaderContext) -> None:
    if not ctx.term.may_write():
        return
    try:
        ctx.db.record_pool_sample()
        status = ctx.db.pool_status()
    except DatabaseUnavailableError as exc:
        log.warning("sampling_failed", error=str(exc))
        return
    ctx.hooks.pool_read(status)

"""Pool sampling: the ticket positions for the claim rate, the reading for the node, and the
age of IDs.

Waking the refill when the pool runs low is the low-water check's job
(:mod:`jobs.low_water`), which reads the pool far more often.
"""

from __future__ import annotations

from collections.abc import Sequence

from allocator.core import logs
from allocator.core.errors import DatabaseError, DatabaseUnavailableError
from allocator.core.layout import Layout
from allocator.core.records import ClaimedBlock, PoolStatus
from jobs.context import LeaderContext

log = logs.get_logger(__name__)

HANDOUT_SAMPLE_LIMIT = 1000


def run(ctx: LeaderContext) -> None:
    """One sampling run: record the ticket positions, hand the pool reading to the node,
    then the age gauges.

    The sample is not a block write (it fences nothing), but only the leader samples so the
    rate is not counted twice; it never waits on ``busy`` (the refill may hold it). A failed
    read of the age (a database unavailable, a schema without migration 0011) is logged; the
    pool reading before it still reaches the node.
    """
    if not ctx.term.may_write():
        return
    try:
        ctx.db.record_pool_sample()
        status = ctx.db.pool_status()
    except DatabaseUnavailableError as exc:
        log.warning("sampling_failed", error=str(exc))
        return
    ctx.hooks.pool_read(status)
    try:
        observe_age(ctx, status)
    except DatabaseError as exc:
        log.warning("age_sampling_failed", error=str(exc))


def observe_age(ctx: LeaderContext, status: PoolStatus) -> None:
    """The age gauges from ``block_age_status``; the hand-out ages since the previous run
    (``allocator_claimed_block_age_seconds``).

    - The blocks claimed with tickets between this term's previous run's claim position and
      the current one (``pool_status.claim_position``, read on the unique ticket index by
      ``claimed_block_ages``), voided ones left out; the first run of a term only takes its
      position, so no claim is counted twice across runs or hand-overs.
    - At most :data:`HANDOUT_SAMPLE_LIMIT` per run, the newest: above that it is a sample. A
      claim still uncommitted at the read is missed (never counted later).
    - Age = ``claimed_at`` minus the first ID's time, decoded with the configuration's
      layout (the one the takeover checked against the database's).
    """
    ctx.metrics.block_age_observed(ctx.db.block_age_status())
    previous, current = ctx.claim_position_sampled, status.claim_position
    ctx.claim_position_sampled = current
    if previous is None or current <= previous:
        return
    blocks = ctx.db.claimed_block_ages(previous, current, HANDOUT_SAMPLE_LIMIT)
    for age_s in handout_ages_s(blocks, ctx.config.layout):
        ctx.metrics.claimed_block_age_seconds.observe(age_s)


def handout_ages_s(blocks: Sequence[ClaimedBlock], layout: Layout) -> list[float]:
    """Each block's age when it was claimed, in seconds (never below 0: a block cut with the
    mark ahead of the clock is claimed "before" its time)."""
    return [
        max(0.0, (b.claimed_at_ms - layout.decode(b.first_id).timestamp_ms) / 1000) for b in blocks
    ]

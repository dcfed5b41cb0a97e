"""Retention: delete claimed blocks older than ``pool.retention_s``, in small batches."""

from __future__ import annotations

from allocator.core import logs
from jobs.batches import write_in_batches
from jobs.context import LeaderContext

log = logs.get_logger(__name__)

BATCH_BLOCKS = 5000
MAX_BATCHES_PER_RUN = 20


def run(ctx: LeaderContext) -> int:
    """One retention run; returns the number of blocks deleted.

    Only claimed blocks, fenced like every block write (``prune_claimed``); the cutoff is
    computed by the database from its own clock (a node's clock never decides what is old
    enough); a bounded number of batches per run (:func:`jobs.batches.write_in_batches`).
    Pruning never lowers the high-water mark, so I1/I2 hold for pruned blocks too.
    """
    deleted = write_in_batches(
        ctx,
        lambda limit: ctx.db.prune_claimed(
            ctx.term.token, ctx.config.pool.retention_s, limit, commit_if=ctx.term.may_write
        ),
        batch_blocks=BATCH_BLOCKS,
        max_batches=MAX_BATCHES_PER_RUN,
        on_unavailable=lambda exc: log.warning(
            "retention_failed", epoch=ctx.term.epoch, error=str(exc)
        ),
    )
    if deleted:
        log.info("retention", epoch=ctx.term.epoch, deleted=deleted)
    return deleted

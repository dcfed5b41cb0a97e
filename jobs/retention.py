"""Retention: delete claimed blocks older than ``pool.retention_s``, in small batches.

Rules: only claimed blocks, fenced like every block write (``prune_claimed``); the cutoff
is computed by the database from its own clock (a node's clock never decides what is old
enough); a bounded
number of batches per run so a large backlog never holds the leader's job slot for long.
Pruning never lowers the high-water mark, so I1/I2 hold for pruned blocks too.
"""

from __future__ import annotations

from allocator.core import logs
from allocator.core.errors import DatabaseUnavailableError, FencedError, WriteAbandonedError
from jobs.context import LeaderContext

log = logs.get_logger(__name__)

BATCH_BLOCKS = 5000
MAX_BATCHES_PER_RUN = 20


def run(ctx: LeaderContext) -> int:
    """One retention run; returns the number of blocks deleted."""
    deleted = 0
    with ctx.busy:
        try:
            for _ in range(MAX_BATCHES_PER_RUN):
                if not ctx.term.may_write():
                    break
                n = ctx.db.prune_claimed(
                    ctx.term.token,
                    ctx.config.pool.retention_s,
                    BATCH_BLOCKS,
                    commit_if=ctx.term.may_write,
                )
                ctx.hooks.health.write_succeeded()
                deleted += n
                if n < BATCH_BLOCKS:
                    break
        except FencedError as exc:
            ctx.metrics.fenced_writes_rejected.inc()
            ctx.hooks.on_fenced(exc)
        except WriteAbandonedError:
            ctx.metrics.writes_abandoned.inc()
        except DatabaseUnavailableError as exc:
            log.warning("retention_failed", epoch=ctx.term.epoch, error=str(exc))
    if deleted:
        log.info("retention", epoch=ctx.term.epoch, deleted=deleted)
    return deleted

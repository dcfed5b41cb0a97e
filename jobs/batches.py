"""Fenced writes in batches: the loop and the error handling the retention and aging jobs
share.
"""

from __future__ import annotations

from collections.abc import Callable

from allocator.core.errors import DatabaseUnavailableError, FencedError, WriteAbandonedError
from jobs.context import LeaderContext


def write_in_batches(
    ctx: LeaderContext,
    write_batch: Callable[[int], int],
    *,
    batch_blocks: int,
    max_batches: int,
    on_unavailable: Callable[[DatabaseUnavailableError], None],
) -> int:
    """Run ``write_batch(batch_blocks)`` under ``ctx.busy`` while the term may write; the
    blocks written in all.

    Stops when a batch writes fewer than ``batch_blocks`` or ``max_batches`` ran (the next
    run goes on, so a large backlog never holds the term's job slot for long); each
    committed batch is reported to the node's health record. Fenced: counted and handed to
    the node, which ends the term. A write abandoned (leadership in doubt): counted. A
    database unavailable: handed to ``on_unavailable`` (each job logs it under its own event
    name); the next run tries again.
    """
    written = 0
    with ctx.busy:
        try:
            for _ in range(max_batches):
                if not ctx.term.may_write():
                    break
                n = write_batch(batch_blocks)
                ctx.hooks.health.write_succeeded()
                written += n
                if n < batch_blocks:
                    break
        except FencedError as exc:
            ctx.metrics.fenced_writes_rejected.inc()
            ctx.hooks.on_fenced(exc)
        except WriteAbandonedError:
            ctx.metrics.writes_abandoned.inc()
        except DatabaseUnavailableError as exc:
            on_unavailable(exc)
    return written

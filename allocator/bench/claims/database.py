"""The databases of ``allocator bench claims``: a stocked template and a fresh clone per run,
never the allocator's database.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from allocator.bench.claims.sql import script
from allocator.bench.server import Server, admin, drop_database
from allocator.bench.stock import (
    BENCH_LAYOUT,
    BLOCK_SIZE_IDS,
    CUT_BLOCKS,
    EPOCH,
    LAYOUT_JSON,
    LEADER_HEARTBEAT,
    NO_BLOCK_OLDER_MS,
    TAKE_FENCE,
)
from allocator.postgres import migrate

CUT_BATCH_BLOCKS = 50_000
TEMPLATE_DB = "bench_claims_template"
RUN_DB = "bench_claims_run"


def build_template(
    server: Server, blocks: int, progress: Callable[[str], None], *, age_bound: bool = True
) -> dict[str, Any]:
    """Create, migrate and stock :data:`TEMPLATE_DB` with ``blocks`` blocks in both queues.

    With ``age_bound`` the template holds a bound on an ID's age (``leader_heartbeat``, as
    a serving leader's) that no stocked block exceeds (:data:`NO_BLOCK_OLDER_MS`), so every
    clone's claims take the path a serving cluster's take; without it, the path of a
    database no leader ever served (faster: migration 0011's unbounded branch).

    Stocked as a leader would (``take_fence`` once, ``cut_blocks`` in arrays of
    :data:`CUT_BATCH_BLOCKS`, with its fence, high-water and overlap checks), the SKIP LOCKED
    queue given the same blocks, then ``VACUUM ANALYZE`` (the template only: a measured clone
    is never vacuumed by hand). Dropped at the end of the matrix."""
    drop_database(server, RUN_DB)
    drop_database(server, TEMPLATE_DB)
    with admin(server) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE_DB)))
    url = server.url(TEMPLATE_DB)
    progress(f"migrating {TEMPLATE_DB}")
    migrate.upgrade_to_head(url)
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(script("setup.sql"))
        conn.execute(TAKE_FENCE, (EPOCH, os.getpid(), LAYOUT_JSON))
        progress(f"cutting {blocks:,} blocks of {BLOCK_SIZE_IDS} IDs (cut_blocks)")
        for start in range(0, blocks, CUT_BATCH_BLOCKS):
            count = min(CUT_BATCH_BLOCKS, blocks - start)
            ranges = [BENCH_LAYOUT.nth_block(start + k, BLOCK_SIZE_IDS) for k in range(count)]
            firsts = [first for first, _ in ranges]
            lasts = [last for _, last in ranges]
            conn.execute(CUT_BLOCKS, (EPOCH, firsts, lasts, LAYOUT_JSON))
        conn.execute(script("stock_queue.sql"), {"blocks": blocks, "block_size": BLOCK_SIZE_IDS})
        if age_bound:
            conn.execute(LEADER_HEARTBEAT, (EPOCH, NO_BLOCK_OLDER_MS, 1000))
        progress("VACUUM ANALYZE of the template")
        conn.execute("VACUUM ANALYZE")
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return {
        "database": TEMPLATE_DB,
        "blocks": blocks,
        "block_size_ids": BLOCK_SIZE_IDS,
        "stock_s": round(time.monotonic() - started, 2),
        "bytes": int(size[0]) if size else 0,
        "schema": "as migrated (stocked through cut_blocks)",
        "age_bound": age_bound,
    }


@contextmanager
def fresh_database(server: Server) -> Iterator[str]:
    """A clone of the stocked template (``CREATE DATABASE … TEMPLATE … STRATEGY FILE_COPY``,
    then ``CHECKPOINT``), dropped afterwards: every run starts from the same pool state."""
    drop_database(server, RUN_DB)
    with admin(server) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(RUN_DB), sql.Identifier(TEMPLATE_DB)
            )
        )
        conn.execute("CHECKPOINT")
    try:
        yield RUN_DB
    finally:
        drop_database(server, RUN_DB)

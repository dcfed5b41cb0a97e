"""The methods ``allocator bench claims`` compares, and how each one is run and read."""

from __future__ import annotations

from typing import Any, Final

import psycopg

from allocator.bench.stock import BLOCK_SIZE_IDS

METHODS: Final = ("claim_blocks", "skip_locked", "segment_update", "nextval", "durable_commit")
"""``claim_blocks`` (ours, as the consumer role), the :data:`BASELINES` and the
:data:`REFERENCE`; each is one pgbench script of :mod:`allocator.bench.claims.sql`."""
BASELINES: Final = ("skip_locked", "segment_update", "nextval")
"""Run as the superuser: a plain FOR UPDATE SKIP LOCKED queue, a Leaf-style segment (step =
batch x block size) and ``nextval`` (CACHE 100, one ID per call, batch 1 only: the ceiling)."""
REFERENCE: Final = "durable_commit"
"""Not a way to claim: the cheapest durable write transaction, the ceiling of any durable
claim on this server (so a ratio to ``nextval`` it cannot reach is visible as such)."""
ONCE_METHODS: Final = ("nextval", REFERENCE)
"""Methods that take no batch: run once, at batch 1."""
TABLE_STATS: Final = """
SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup, n_live_tup, autovacuum_count,
       pg_relation_size(relid) AS heap_bytes
  FROM pg_stat_user_tables WHERE relid = %s::regclass
"""
UNCLAIMED: Final = {
    "claim_blocks": "SELECT count(*) FROM allocator.blocks WHERE claimed_at IS NULL",
    "skip_locked": "SELECT count(*) FROM bench.skip_locked_queue WHERE claimed_at IS NULL",
}
TABLES: Final = {"claim_blocks": "allocator.blocks", "skip_locked": "bench.skip_locked_queue"}


def script_for(method: str, batch: int) -> tuple[str, dict[str, int]]:
    """The pgbench script of ``method`` and its ``-D`` defines at ``batch``."""
    if method == "claim_blocks":
        return "claim_blocks.pgbench", {"batch": batch}
    if method == "skip_locked":
        return (
            ("skip_locked.pgbench", {})
            if batch == 1
            else (
                "skip_locked_batch.pgbench",
                {"batch": batch},
            )
        )
    if method == "segment_update":
        return "segment_update.pgbench", {"step": batch * BLOCK_SIZE_IDS}
    if method == REFERENCE:
        return "durable_commit.pgbench", {}
    return "nextval.pgbench", {}


def ids_per_claim(method: str, batch: int) -> int:
    """How many IDs one transaction of ``method`` hands out at ``batch``."""
    if method == REFERENCE:
        return 0  # hands out nothing
    return 1 if method == "nextval" else batch * BLOCK_SIZE_IDS


def table_stats(conn: psycopg.Connection[tuple[Any, ...]], method: str) -> dict[str, Any]:
    """The queue table's statistics and unclaimed blocks; only the two queues
    (``claim_blocks``, ``skip_locked``) have any."""
    if method not in TABLES:
        return {}
    conn.execute("SELECT pg_stat_force_next_flush()")
    cursor = conn.execute(TABLE_STATS, (TABLES[method],))
    row = cursor.fetchone()
    names = [column.name for column in cursor.description or ()]
    stats = dict(zip(names, row, strict=True)) if row else {}
    unclaimed = conn.execute(UNCLAIMED[method]).fetchone()
    stats["unclaimed_blocks"] = int(unclaimed[0]) if unclaimed else 0
    return stats

"""Every SQL statement of ``allocator bench sustained``, in one named place: reads of
statistics views and of ``allocator.pool_status`` only; the claims are pgbench's
(``claim_blocks.pgbench`` of :mod:`allocator.bench.claims.sql`)."""

from __future__ import annotations

from typing import Final

POOL: Final = (
    "SELECT available_blocks, cut_position, claim_position, holder FROM allocator.pool_status"
)
BLOCK_SIZE: Final = "SELECT last_id - first_id + 1 FROM allocator.blocks LIMIT 1"
AGE_BOUND: Final = "SELECT allocator.age_bound_id() IS NOT NULL"
"""Whether ``claim_blocks`` takes its path with the age bound (migration 0011): a serving
leader keeps one in force; a database no leader ever served (the burst's clone) has none."""
SYNC_NAMES: Final = "SHOW synchronous_standby_names"
SYNC_COMMIT: Final = "SHOW synchronous_commit"
REPLICATION: Final = """
SELECT application_name, state, sync_state,
       extract(epoch FROM write_lag) * 1000 AS write_lag_ms,
       extract(epoch FROM flush_lag) * 1000 AS flush_lag_ms,
       extract(epoch FROM replay_lag) * 1000 AS replay_lag_ms
  FROM pg_stat_replication ORDER BY application_name
"""
WAIT_EVENTS: Final = """
SELECT CASE WHEN usename = %(claims)s THEN 'claims'
            WHEN usename = %(nodes)s THEN 'nodes'
            ELSE backend_type END AS who,
       CASE WHEN state = 'idle' OR wait_event_type = 'Activity' THEN 'idle'
            ELSE coalesce(wait_event_type || ':' || wait_event, 'CPU') END AS what,
       count(*)
  FROM pg_stat_activity
 WHERE pid <> pg_backend_pid()
 GROUP BY 1, 2
"""
"""Who (the claiming role, the nodes' role, else the backend type) waits on what; ``CPU``:
no wait event (running, or between two reports); ``idle``: a session waiting for its
client's next statement, or a background process in its main loop."""
WAL: Final = """
SELECT wal_records, wal_fpi, wal_bytes::bigint, wal_buffers_full, wal_write, wal_sync,
       wal_write_time, wal_sync_time
  FROM pg_stat_wal
"""
DATABASE: Final = """
SELECT xact_commit, xact_rollback, tup_returned, tup_fetched, tup_inserted, tup_updated,
       tup_deleted, blks_read, blks_hit
  FROM pg_stat_database WHERE datname = %s
"""
CHECKPOINTS: Final = """
SELECT checkpoints_timed, checkpoints_req, buffers_checkpoint, buffers_backend,
       buffers_backend_fsync
  FROM pg_stat_bgwriter
"""
FLUSH_STATS: Final = "SELECT pg_stat_force_next_flush()"

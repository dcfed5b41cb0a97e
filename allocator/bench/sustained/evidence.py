"""What a sustained run reads around itself: the standby's state before measuring, and the
server's counters (WAL, transactions, checkpoints) before and after, as deltas per claim."""

from __future__ import annotations

from typing import Any

import psycopg

from allocator.bench.server import BenchError
from allocator.bench.sustained import queries


def standby_state(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """``synchronous_standby_names``, ``synchronous_commit`` and the walsenders; a primary
    with no standby streaming ``sync`` is a :class:`BenchError`: the run would measure a
    server users must not run (docs/postgres-ha.md)."""
    names = conn.execute(queries.SYNC_NAMES).fetchone()
    commit = conn.execute(queries.SYNC_COMMIT).fetchone()
    standbys = [
        {"name": name, "state": state, "sync_state": sync}
        for name, state, sync, *_ in conn.execute(queries.REPLICATION)
    ]
    state = {
        "synchronous_standby_names": str(names[0]) if names else "",
        "synchronous_commit": str(commit[0]) if commit else "",
        "standbys": standbys,
    }
    if not state["synchronous_standby_names"] or not any(
        s["sync_state"] == "sync" and s["state"] == "streaming" for s in standbys
    ):
        raise BenchError(f"no synchronous standby streams from the primary: {state}")
    return state


def counters(conn: psycopg.Connection[Any], database: str) -> dict[str, dict[str, int]]:
    """pg_stat_wal, the allocator database's pg_stat_database row and pg_stat_bgwriter, after
    this session's statistics are flushed (other sessions flush theirs at most a second
    late: a small error at both ends of a run)."""
    conn.execute(queries.FLUSH_STATS)
    found: dict[str, dict[str, int]] = {}
    for name, query, args in (
        ("wal", queries.WAL, ()),
        ("database", queries.DATABASE, (database,)),
        ("checkpoints", queries.CHECKPOINTS, ()),
    ):
        cursor = conn.execute(query, args)
        row = cursor.fetchone()
        columns = [column.name for column in cursor.description or ()]
        found[name] = {c: int(v or 0) for c, v in zip(columns, row or (), strict=False)}
    return found


def deltas(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """``after`` minus ``before``, counter by counter."""
    return {
        group: {key: value - before[group].get(key, 0) for key, value in values.items()}
        for group, values in after.items()
    }


def per_claim(delta: dict[str, dict[str, int]], claims: int, seconds: float) -> dict[str, Any]:
    """What the limits are read from: WAL records, bytes and flushes per claim, claims per
    flush, and the allocator database's transactions that were not claims, per second."""
    wal = delta["wal"]
    return {
        "wal_records_per_claim": _div(wal["wal_records"], claims),
        "wal_bytes_per_claim": _div(wal["wal_bytes"], claims),
        "wal_fpi_per_claim": _div(wal["wal_fpi"], claims),
        "wal_writes_per_claim": _div(wal["wal_write"], claims),
        "wal_syncs_per_claim": _div(wal["wal_sync"], claims),
        "claims_per_wal_sync": _div(claims, wal["wal_sync"]),
        "wal_bytes_per_s": _div(wal["wal_bytes"], seconds),
        "checkpoints": delta["checkpoints"]["checkpoints_timed"]
        + delta["checkpoints"]["checkpoints_req"],
    }


def _div(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None

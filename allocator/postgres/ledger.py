"""What the invariant checker judges, read from a cluster's database
(:mod:`allocator.core.verify`).

Reads only views the operator role may read (docs/sql.md), so an embedded cluster's
superuser URL and an ``allocator_operator`` login both work; nothing is written. Retention
must not prune during a judged run, or pruned claims are reported as lost.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg

from allocator.core.errors import DatabaseError
from allocator.core.layout import Layout
from allocator.core.verify import (
    Claim,
    LedgerRow,
    ServingRow,
    TermRow,
    Violation,
    WriteRow,
    check,
)

CONNECT_TIMEOUT_S = 5

READ_LEDGER: Final = (
    "SELECT block_id, first_id, last_id, epoch, cut_at, claimed_by, claimed_at, generation"
    " FROM allocator.block_ledger ORDER BY block_id"
)
READ_HISTORY: Final = (
    "SELECT epoch, holder, elected_at, ended_at, end_reason, generation"
    " FROM allocator.leader_history ORDER BY elected_at, generation, epoch"
)
READ_WRITES: Final = (
    "SELECT write_id, written_at, kind, generation, epoch, blocks"
    " FROM allocator.fenced_writes ORDER BY write_id"
)
"""The fenced requeues and prunes that changed something, in write order."""
READ_SERVING: Final = (
    "SELECT stretch_id, generation, epoch, max_block_age_ms, serve_aged_without_leader,"
    " leader_stale_ms, first_at, last_at, heartbeats"
    " FROM allocator.serving_history ORDER BY stretch_id"
)
"""When a bound on an ID's age was in force (migration 0011)."""
HAS_SERVING: Final = "SELECT to_regclass('allocator.serving_history') IS NOT NULL"
READ_LAYOUT: Final = (
    "SELECT epoch_ms, timestamp_bits, datacenter_bits, lane_bits, sequence_bits, datacenter_id"
    " FROM allocator.layout"
)


@dataclass(frozen=True)
class Evidence:
    """Everything of a run the database holds: the checker's inputs but the records."""

    ledger: list[LedgerRow]
    history: list[TermRow]
    writes: list[WriteRow]
    layout: Layout | None
    """As recorded by the first takeover; None before any."""
    datacenter_id: int | None
    serving: list[ServingRow] = field(default_factory=list)
    """The leader's serving stretches; none before migration 0011."""


def read_ledger(conn: psycopg.Connection[Any]) -> list[LedgerRow]:
    """Every row of ``allocator.block_ledger``, in block order."""
    return [LedgerRow(*row) for row in conn.execute(READ_LEDGER).fetchall()]


def read_history(conn: psycopg.Connection[Any]) -> list[TermRow]:
    """Every row of ``allocator.leader_history``."""
    return [TermRow(*row) for row in conn.execute(READ_HISTORY).fetchall()]


def read_writes(conn: psycopg.Connection[Any]) -> list[WriteRow]:
    """Every row of ``allocator.fenced_writes`` (the requeues and prunes that changed
    something).
    """
    return [WriteRow(*row) for row in conn.execute(READ_WRITES).fetchall()]


def read_serving(conn: psycopg.Connection[Any]) -> list[ServingRow]:
    """The serving stretches; [] on a database without them (before migration 0011: no bound
    to judge).
    """
    row = conn.execute(HAS_SERVING).fetchone()
    if row is None or not row[0]:
        return []
    return [ServingRow(*found) for found in conn.execute(READ_SERVING).fetchall()]


def read_layout(conn: psycopg.Connection[Any]) -> tuple[Layout | None, int | None]:
    """The recorded layout and datacenter id; (None, None) before the first takeover, when
    the caller's layout stands in.
    """
    row = conn.execute(READ_LAYOUT).fetchone()
    if row is None:
        return None, None
    epoch_ms, timestamp_bits, datacenter_bits, lane_bits, sequence_bits, datacenter_id = row
    layout = Layout(
        epoch_ms=int(epoch_ms),
        timestamp_bits=int(timestamp_bits),
        datacenter_bits=int(datacenter_bits),
        lane_bits=int(lane_bits),
        sequence_bits=int(sequence_bits),
    )
    return layout, int(datacenter_id)


def read(conn: psycopg.Connection[Any]) -> Evidence:
    """The ledger, the history, the fenced writes, the layout and the serving stretches, on
    ``conn``."""
    layout, datacenter_id = read_layout(conn)
    return Evidence(
        read_ledger(conn),
        read_history(conn),
        read_writes(conn),
        layout,
        datacenter_id,
        read_serving(conn),
    )


def read_url(url: str, *, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> Evidence:
    """:func:`read` on a connection of its own to ``url`` (closed before returning)."""
    try:
        with psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=max(1, round(connect_timeout_s)),
            application_name="allocator-verify",
        ) as conn:
            return read(conn)
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatabaseError(f"cannot read the ledger and leader history: {reason}") from exc


def judge(
    records: Iterable[Claim],
    evidence: Evidence,
    *,
    layout: Layout,
    max_clock_ahead_ms: int,
    initial_lead_ms: int = 0,
) -> list[Violation]:
    """:func:`allocator.core.verify.check` over ``records`` and ``evidence``; ``layout`` stands in
    when the database has recorded none."""
    return check(
        records,
        evidence.ledger,
        evidence.history,
        evidence.layout or layout,
        evidence.writes,
        max_clock_ahead_ms=max_clock_ahead_ms,
        initial_lead_ms=initial_lead_ms,
        datacenter_id=evidence.datacenter_id,
        serving=evidence.serving,
    )

"""The chaos checker: invariants I1-I5 (DESIGN §2) from the consumers' own records and the ledger.

:func:`check` takes what the consumers recorded (every claim that *returned* to them), the
``allocator.block_ledger`` and ``allocator.leader_history`` views (read as superuser after
the run) and the Snowflake layout, and returns every violation found; an empty list means
the run was clean. It is pure (no I/O), so ``tests/unit/test_checker.py`` proves on
synthetic data that each kind of violation is caught.

Rules, one per invariant (the ``invariant`` field of a :class:`Violation`):

- I1 no overlap, no double hand-out: no two ledger blocks overlap and none is malformed; no
  block was returned to consumers twice; no two ranges consumers received overlap; a block
  a consumer received is not recorded in the ledger as claimed by another consumer.
- I2 cut order: in ``block_id`` order (the order blocks were inserted, i.e. cut), every
  block starts strictly after the last ID of every earlier block.
- I3 fencing: every block's epoch is a term in the leader history, and its ``cut_at``
  (the cutting statement's start, PostgreSQL's clock) lies in ``[elected_at, ended_at)`` of
  that term: no committed write by a stale epoch. The history itself never has two terms at
  once, and epochs grow with ``elected_at`` (the fence only moves forward). All three are
  statement start times; the fence row lock orders a cut and a takeover, so a cut that
  began after the takeover's statement is one that found the new epoch (AL100) — only a
  cut slipping in the microseconds between ``take_fence``'s start and its lock would be
  reported although the fence allowed it, a case the chaos runs have never produced.
- I4 durability: every range a consumer received is in the ledger, with the same bounds,
  claimed by that consumer.
- I5 time: the decoded timestamps of first IDs never go backwards in cut order, and none is
  past the layout's end. (Every ID in ``0..2^63-1`` decodes to a millisecond at or before
  ``layout.ends_at_ms``, so "past the end" means an ID outside that range.)

Retention must not prune during a chaos run (its default keeps a day), or I4 would report
pruned blocks as lost. Claims whose reply was lost (an error after the commit) are in the
ledger but not in the records: that is allowed, not a violation.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from allocator.errors import InvalidIdError
from allocator.layout import Layout

MAX_PER_RULE = 50
"""Violations reported per rule at most: one broken rule must not drown the report."""


@dataclass(frozen=True)
class Claim:
    """One block a consumer received from ``allocator.claim_blocks``."""

    block_id: int
    first_id: int
    last_id: int
    consumer: str
    returned_at: float = 0.0
    """Wall clock (``time.time()``) when the call returned."""


@dataclass(frozen=True)
class LedgerRow:
    """One row of ``allocator.block_ledger``."""

    block_id: int
    first_id: int
    last_id: int
    epoch: int
    cut_at: datetime
    claimed_by: str | None
    claimed_at: datetime | None


@dataclass(frozen=True)
class TermRow:
    """One row of ``allocator.leader_history``."""

    epoch: int
    holder: str
    elected_at: datetime
    ended_at: datetime | None
    end_reason: str | None


@dataclass(frozen=True)
class Violation:
    invariant: str
    """``"I1"`` … ``"I5"``."""
    message: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.message}"


def check(
    records: Iterable[Claim],
    ledger_rows: Iterable[LedgerRow],
    leader_history: Iterable[TermRow],
    layout: Layout,
) -> list[Violation]:
    """Every violation of I1-I5 in one chaos run (see the module rules); [] when clean."""
    claims = list(records)
    ledger = sorted(ledger_rows, key=lambda row: row.block_id)
    terms = sorted(leader_history, key=lambda term: (term.elected_at, term.epoch))
    found: list[Violation] = []
    for rule in (
        _ledger_disjoint(ledger),
        _handed_out_once(claims),
        _claims_disjoint(claims),
        _claims_match_ledger(claims, ledger),
        _cut_order(ledger),
        _history_consistent(terms),
        _written_by_fence_holder(ledger, terms),
        _timestamps(ledger, layout),
    ):
        found.extend(itertools.islice(rule, MAX_PER_RULE))
    return found


def summary(violations: Sequence[Violation], limit: int = 20) -> str:
    """A readable assertion message: counts per invariant, then the first ``limit``."""
    counts: dict[str, int] = {}
    for violation in violations:
        counts[violation.invariant] = counts.get(violation.invariant, 0) + 1
    head = ", ".join(f"{kind}: {n}" for kind, n in sorted(counts.items()))
    lines = [f"{len(violations)} violation(s) ({head})"]
    lines += [f"  {violation}" for violation in violations[:limit]]
    return "\n".join(lines)


# -- I1 ---------------------------------------------------------------------------------------


def _ledger_disjoint(ledger: Sequence[LedgerRow]) -> Iterable[Violation]:
    for row in ledger:
        if row.last_id < row.first_id:
            yield Violation("I1", f"block {row.block_id} is malformed: {_span(row)}")
    by_first = sorted(ledger, key=lambda row: (row.first_id, row.block_id))
    for a, b in itertools.pairwise(by_first):
        if b.first_id <= a.last_id:
            yield Violation(
                "I1", f"ledger blocks {a.block_id} {_span(a)} and {b.block_id} {_span(b)} overlap"
            )


def _handed_out_once(claims: Sequence[Claim]) -> Iterable[Violation]:
    seen: dict[int, Claim] = {}
    for claim in claims:
        earlier = seen.setdefault(claim.block_id, claim)
        if earlier is not claim:
            yield Violation(
                "I1",
                f"block {claim.block_id} was handed out twice: to {earlier.consumer!r} and "
                f"to {claim.consumer!r}",
            )


def _claims_disjoint(claims: Sequence[Claim]) -> Iterable[Violation]:
    distinct = {claim.block_id: claim for claim in claims}  # repeats: _handed_out_once
    by_first = sorted(distinct.values(), key=lambda claim: (claim.first_id, claim.block_id))
    for a, b in itertools.pairwise(by_first):
        if b.first_id <= a.last_id:
            yield Violation(
                "I1",
                f"{a.consumer!r} got {_span(a)} (block {a.block_id}) and {b.consumer!r} got "
                f"{_span(b)} (block {b.block_id}): the ranges overlap",
            )


# -- I1 and I4: what consumers got against what the ledger says ------------------------------


def _claims_match_ledger(
    claims: Sequence[Claim], ledger: Sequence[LedgerRow]
) -> Iterable[Violation]:
    rows = {row.block_id: row for row in ledger}
    for claim in claims:
        row = rows.get(claim.block_id)
        if row is None:
            yield Violation(
                "I4",
                f"block {claim.block_id} {_span(claim)} returned to {claim.consumer!r} is "
                "missing from the ledger",
            )
        elif (row.first_id, row.last_id) != (claim.first_id, claim.last_id):
            yield Violation(
                "I4",
                f"block {claim.block_id}: {claim.consumer!r} got {_span(claim)}, the ledger "
                f"says {_span(row)}",
            )
        elif row.claimed_by is None:
            yield Violation(
                "I4",
                f"block {claim.block_id} returned to {claim.consumer!r} is unclaimed in the "
                "ledger (the claim was not durable)",
            )
        elif row.claimed_by != claim.consumer:
            yield Violation(
                "I1",
                f"block {claim.block_id} returned to {claim.consumer!r} is claimed by "
                f"{row.claimed_by!r} in the ledger",
            )


# -- I2 ---------------------------------------------------------------------------------------


def _cut_order(ledger: Sequence[LedgerRow]) -> Iterable[Violation]:
    highest: LedgerRow | None = None
    for row in ledger:
        if highest is not None and row.first_id <= highest.last_id:
            yield Violation(
                "I2",
                f"block {row.block_id} starts at {row.first_id}, not after block "
                f"{highest.block_id}, cut earlier, which ends at {highest.last_id}",
            )
        if highest is None or row.last_id > highest.last_id:
            highest = row


# -- I3 ---------------------------------------------------------------------------------------


def _history_consistent(terms: Sequence[TermRow]) -> Iterable[Violation]:
    for a, b in itertools.pairwise(terms):
        if b.epoch <= a.epoch:
            yield Violation(
                "I3",
                f"epoch {b.epoch} ({b.holder}) was elected after epoch {a.epoch} ({a.holder}): "
                "the fence moved backwards",
            )
        if a.ended_at is None or a.ended_at > b.elected_at:
            ended = "never ended" if a.ended_at is None else f"ended at {a.ended_at.isoformat()}"
            yield Violation(
                "I3",
                f"term {a.epoch} ({a.holder}) {ended}, after term {b.epoch} ({b.holder}) began "
                f"at {b.elected_at.isoformat()}: two terms at once",
            )


def _written_by_fence_holder(
    ledger: Sequence[LedgerRow], terms: Sequence[TermRow]
) -> Iterable[Violation]:
    by_epoch = {term.epoch: term for term in terms}
    for row in ledger:
        term = by_epoch.get(row.epoch)
        if term is None:
            yield Violation(
                "I3",
                f"block {row.block_id} was written with epoch {row.epoch}, which never held "
                "the fence",
            )
        elif row.cut_at < term.elected_at:
            yield Violation(
                "I3",
                f"block {row.block_id} (epoch {row.epoch}) was cut at {row.cut_at.isoformat()}, "
                f"before its term began at {term.elected_at.isoformat()}",
            )
        elif term.ended_at is not None and row.cut_at >= term.ended_at:
            yield Violation(
                "I3",
                f"block {row.block_id} (epoch {row.epoch}, {term.holder}) was cut at "
                f"{row.cut_at.isoformat()}, after its term ended at "
                f"{term.ended_at.isoformat()} ({term.end_reason}): a stale write committed",
            )


# -- I5 ---------------------------------------------------------------------------------------


def _timestamps(ledger: Sequence[LedgerRow], layout: Layout) -> Iterable[Violation]:
    latest: tuple[int, int] | None = None  # (timestamp_ms, block_id)
    for row in ledger:
        try:
            timestamp_ms = layout.decode(row.first_id).timestamp_ms
        except InvalidIdError as exc:
            # The only way past the layout's end: every 63-bit ID decodes to a millisecond
            # at or before ``layout.ends_at_ms`` (the timestamp field is that wide).
            yield Violation(
                "I5", f"block {row.block_id}: first ID {row.first_id} is past the layout: {exc}"
            )
            continue
        if latest is not None and timestamp_ms < latest[0]:
            yield Violation(
                "I5",
                f"block {row.block_id} carries {timestamp_ms} ms, before block {latest[1]} "
                f"cut earlier ({latest[0]} ms): time went backwards",
            )
        if latest is None or timestamp_ms > latest[0]:
            latest = (timestamp_ms, row.block_id)


def _span(item: Claim | LedgerRow) -> str:
    return f"[{item.first_id}, {item.last_id}]"

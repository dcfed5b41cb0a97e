"""The invariant checker: I1-I7 (docs/design.md §2, §11, §12) judged from what a run left
behind.

Pure (no I/O, no clock), so ``tests/unit/test_verify.py`` proves on synthetic data that each
kind of violation is caught; ``allocator drill``, ``allocator demo`` and the chaos suite
judge their runs with :func:`check` (docs/design.md §9).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from allocator.core.errors import InvalidIdError
from allocator.core.layout import Layout

MAX_PER_RULE = 50
"""Violations reported per rule at most: one broken rule must not drown the report."""
SERVING_GRACE_MS = 1000
"""Left unjudged at each end of a serving stretch (I7): a heartbeat's commit takes far less."""
_FOREVER = datetime.max.replace(tzinfo=UTC)
VOID_PREFIX = "allocator:"
"""``claimed_by`` of blocks the allocator voided (``allocator:voided-aged``,
``allocator:voided-by-reset``): never handed out."""

Token = tuple[int, int]
"""``(generation, epoch)``: the fencing token, ordered as the fence orders it."""


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
class WriteRow:
    """One row of ``allocator.fenced_writes``: a requeue or prune that changed something."""

    write_id: int
    written_at: datetime
    kind: str
    generation: int
    epoch: int
    blocks: int


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
    generation: int = 0


@dataclass(frozen=True)
class TermRow:
    """One row of ``allocator.leader_history``."""

    epoch: int
    holder: str
    elected_at: datetime
    ended_at: datetime | None
    end_reason: str | None
    generation: int = 0


@dataclass(frozen=True)
class ServingRow:
    """One row of ``allocator.serving_history``: a stretch of one leader's heartbeats."""

    stretch_id: int
    generation: int
    epoch: int
    max_block_age_ms: int
    serve_aged_without_leader: bool
    leader_stale_ms: int
    first_at: datetime
    last_at: datetime
    heartbeats: int = 1


@dataclass(frozen=True)
class Violation:
    """One broken rule: the invariant (``"I1"`` … ``"I7"``) and what was seen."""

    invariant: str
    message: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        """The violation as a drill report's JSON object."""
        return {"invariant": self.invariant, "message": self.message}


def check(
    records: Iterable[Claim],
    ledger_rows: Iterable[LedgerRow],
    leader_history: Iterable[TermRow],
    layout: Layout,
    writes: Iterable[WriteRow] = (),
    *,
    max_clock_ahead_ms: int = 1000,
    initial_lead_ms: int = 0,
    datacenter_id: int | None = None,
    serving: Iterable[ServingRow] = (),
    serving_grace_ms: int = SERVING_GRACE_MS,
) -> list[Violation]:
    """Every violation of I1-I5 and I7 in one run; [] when clean.

    Inputs: what the consumers recorded (every claim that *returned* to them, see
    :mod:`allocator.drill.consumers`), the ``allocator.block_ledger`` and
    ``allocator.leader_history`` views, the fenced maintenance writes
    (``allocator.fenced_writes``), the leader's serving stretches
    (``allocator.serving_history``, migration 0011) and the layout, all read by
    :mod:`allocator.postgres.ledger`. Each rule is the docstring of the helper that judges
    it. At most :data:`MAX_PER_RULE` violations are reported per rule.

    - Retention must not prune during a judged run (its default keeps a day), or I4 would
      report pruned blocks as lost.
    - A claim whose reply was lost (an error after the commit) is in the ledger but not in
      the records: allowed, not a violation.
    - I6 is not checkable from these inputs: the database never learns when a node's session
      was suspended or lost, and a write made while the fence is still the node's looks
      legitimate. Its consequence that matters, a write landing after a successor's, is I3;
      the chaos suite checks I6 itself from the nodes' logs and metrics.
    """
    claims = list(records)
    ledger = sorted(ledger_rows, key=lambda row: row.block_id)
    by_first = sorted(ledger, key=lambda row: (row.first_id, row.block_id))
    terms = sorted(leader_history, key=lambda term: (term.elected_at, term.generation, term.epoch))
    fenced = sorted(writes, key=lambda row: row.write_id)
    found: list[Violation] = []
    for rule in (
        _ledger_disjoint(by_first),
        _inside_the_datacenter(ledger, layout, datacenter_id),
        _handed_out_once(claims),
        _claims_disjoint(claims),
        _claims_match_ledger(claims, ledger),
        _cut_order(ledger),
        _history_consistent(terms),
        _tokens_recorded("block", [(r.block_id, _token(r)) for r in ledger], terms),
        _tokens_recorded("write", [(w.write_id, _token(w)) for w in fenced], terms),
        _tokens_in_order("block", "cut", [(r.block_id, _token(r)) for r in by_first]),
        _tokens_in_order("write", "written", [(w.write_id, _token(w)) for w in fenced]),
        _timestamps(ledger, layout),
        _within_clock_bound(ledger, layout, max_clock_ahead_ms, initial_lead_ms),
        _within_age_bound(ledger, _bound_windows(serving, serving_grace_ms), layout),
    ):
        found.extend(itertools.islice(rule, MAX_PER_RULE))
    return found


def summary(violations: Sequence[Violation], limit: int = 20) -> str:
    """A readable report: counts per invariant, then the first ``limit`` violations."""
    lines = [f"{len(violations)} violation(s) ({counts_text(violations)})"]
    lines += [f"  {violation}" for violation in violations[:limit]]
    return "\n".join(lines)


def counts(violations: Iterable[Violation]) -> dict[str, int]:
    """Violations per invariant, in invariant order."""
    found: dict[str, int] = {}
    for violation in violations:
        found[violation.invariant] = found.get(violation.invariant, 0) + 1
    return dict(sorted(found.items()))


def counts_text(violations: Iterable[Violation]) -> str:
    """``"I1: 2, I3: 5"``; ``"none"`` for a clean run."""
    return ", ".join(f"{kind}: {n}" for kind, n in counts(violations).items()) or "none"


# -- I1 ---------------------------------------------------------------------------------------


def _ledger_disjoint(by_first: Sequence[LedgerRow]) -> Iterable[Violation]:
    """I1: no two ledger blocks overlap and none is malformed."""
    for row in by_first:
        if row.last_id < row.first_id:
            yield Violation("I1", f"block {row.block_id} is malformed: {_span(row)}")
    for a, b in itertools.pairwise(by_first):
        if b.first_id <= a.last_id:
            yield Violation(
                "I1", f"ledger blocks {a.block_id} {_span(a)} and {b.block_id} {_span(b)} overlap"
            )


def _inside_the_datacenter(
    ledger: Sequence[LedgerRow], layout: Layout, datacenter_id: int | None
) -> Iterable[Violation]:
    """I1 across clusters: with the datacenter id known (the layout the database recorded),
    every block lies inside one millisecond of that datacenter, as ``cut_blocks`` checks on
    every cut (docs/design.md §5, §11), so two clusters never collide.
    """
    if datacenter_id is None:
        return
    shift = layout.lane_bits + layout.sequence_bits
    for row in ledger:
        if row.last_id < row.first_id:
            continue  # reported by _ledger_disjoint
        try:
            first = layout.decode(row.first_id)
        except InvalidIdError:
            continue  # reported by _timestamps
        if first.datacenter != datacenter_id:
            yield Violation(
                "I1",
                f"block {row.block_id} {_span(row)} lies in datacenter {first.datacenter}, not "
                f"in this cluster's {datacenter_id}",
            )
        elif row.first_id >> shift != row.last_id >> shift:
            yield Violation(
                "I1",
                f"block {row.block_id} {_span(row)} spans more than one (millisecond, "
                "datacenter) prefix",
            )


def _handed_out_once(claims: Sequence[Claim]) -> Iterable[Violation]:
    """I1: no block was returned to consumers twice."""
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
    """I1: no two ranges consumers received overlap."""
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
    """I4: every range a consumer received is in the ledger with the same bounds, claimed by
    that consumer; I1: not claimed by another consumer.
    """
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
    """I2: in ``block_id`` order (insertion, i.e. cut order: cuts are serialised on the
    high-water row) every block starts strictly after the last ID of every earlier block.
    """
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


def _token(item: TermRow | LedgerRow | WriteRow | ServingRow) -> Token:
    return (item.generation, item.epoch)


def _history_consistent(terms: Sequence[TermRow]) -> Iterable[Violation]:
    """I3: the history never has two terms at once (a term still open, or ended after the
    next began), and its tokens grow with ``elected_at`` (both times are taken under the
    fence row's lock).
    """
    for a, b in itertools.pairwise(terms):
        if _token(b) <= _token(a):
            yield Violation(
                "I3",
                f"token {_token(b)} ({b.holder}) was elected after token {_token(a)} "
                f"({a.holder}): the fence moved backwards",
            )
        if a.ended_at is None or a.ended_at > b.elected_at:
            ended = "never ended" if a.ended_at is None else f"ended at {a.ended_at.isoformat()}"
            yield Violation(
                "I3",
                f"term {_token(a)} ({a.holder}) {ended}, after term {_token(b)} ({b.holder}) "
                f"began at {b.elected_at.isoformat()}: two terms at once",
            )


def _tokens_recorded(
    kind: str, tokens: Sequence[tuple[int, Token]], terms: Sequence[TermRow]
) -> Iterable[Violation]:
    """Every write carries a token that held the fence (a term of the history)."""
    recorded = {_token(term) for term in terms}
    for ident, token in tokens:
        if token not in recorded:
            yield Violation(
                "I3",
                f"{kind} {ident} was written with token {token}, which never held the fence",
            )


def _tokens_in_order(
    kind: str, verb: str, tokens: Sequence[tuple[int, Token]]
) -> Iterable[Violation]:
    """In ``tokens``' order the token never goes back: a smaller one is a stale leader's
    (I3).

    Blocks are judged in first-ID order, requeues and prunes in write order. I3 is judged by
    order, not by comparing ``cut_at`` with a term's ``[elected_at, ended_at)``: those come
    from different transactions (across a PostgreSQL failover, different servers' clocks),
    and a successor's takeover time can precede a legitimate cut that took the fence lock
    first. Order's blind spot is a stale write after the takeover but before the successor's
    first write; the fence's exact-token lock in ``cut_blocks`` (docs/design.md §3) forbids
    that one, and ``tests/chaos/test_checker_proof.py`` and the drill's broken-fence test
    show a stale leader writing alongside its successor is caught.
    """
    newest: tuple[int, Token] | None = None
    for ident, token in tokens:
        if newest is not None and token < newest[1]:
            yield Violation(
                "I3",
                f"{kind} {ident} carries token {token}, older than token {newest[1]} of "
                f"{kind} {newest[0]} {verb} before it: a stale write committed",
            )
        if newest is None or token > newest[1]:
            newest = (ident, token)


# -- I5 ---------------------------------------------------------------------------------------


def _within_clock_bound(
    ledger: Sequence[LedgerRow], layout: Layout, max_clock_ahead_ms: int, initial_lead_ms: int
) -> Iterable[Violation]:
    """I5, the clock rule (docs/design.md §11): no block's last ID carries a millisecond
    past its ``cut_at`` (the database clock) plus ``max(max_clock_ahead_ms, the lead of
    the block cut before it)``.

    Blocks of one ``cut_blocks`` call share their ``cut_at`` and token; the allowance of a
    call is the lead of the last block of the call before it (what the database compared);
    the first block in the ledger is judged against ``initial_lead_ms``.
    """
    lead_ms = initial_lead_ms
    for _key, group in itertools.groupby(ledger, key=lambda row: (row.cut_at, _token(row))):
        allowed_ms = max(max_clock_ahead_ms, lead_ms)
        for row in group:
            try:
                block_ms = layout.decode(row.last_id).timestamp_ms
            except InvalidIdError:
                continue  # reported by _timestamps
            cut_ms = int(row.cut_at.timestamp() * 1000)
            if block_ms - cut_ms > allowed_ms:
                yield Violation(
                    "I5",
                    f"block {row.block_id} carries {block_ms} ms, {block_ms - cut_ms} ms past "
                    f"the database clock at its cut; at most {allowed_ms} ms allowed: a clock "
                    "ahead moved the mark",
                )
            lead_ms = max(0, block_ms - cut_ms)


def _timestamps(ledger: Sequence[LedgerRow], layout: Layout) -> Iterable[Violation]:
    """I5: decoded first-ID timestamps never go backwards in cut order, and none is past the
    layout's end (an ID outside ``0..2^63-1``).
    """
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


# -- I7 ---------------------------------------------------------------------------------------

BoundWindow = tuple[datetime, datetime, int, ServingRow]
"""When a bound was in force for sure: (from, until, max_block_age_ms, the stretch)."""


def _bound_windows(serving: Iterable[ServingRow], grace_ms: int) -> list[BoundWindow]:
    """When a bound on an ID's age was in force for sure, from the serving stretches.

    A stretch is heartbeats no more than ``leader_stale_ms / 2`` apart, so a leader served,
    as ``claim_blocks`` judged it, from ``first_at`` to ``last_at + leader_stale_ms``; with
    ``serve_aged_without_leader`` false the bound held on until the next stretch began. A
    heartbeat is visible to claims only once it commits, so ``grace_ms`` is left unjudged at
    both ends.
    """
    stretches = sorted(serving, key=lambda row: (row.first_at, row.stretch_id))
    grace = timedelta(milliseconds=grace_ms)
    windows: list[BoundWindow] = []
    for index, row in enumerate(stretches):
        start = row.first_at + grace
        if row.serve_aged_without_leader:
            end = row.last_at + timedelta(milliseconds=row.leader_stale_ms) - grace
        else:  # the bound held on, leader or not, until the next leader's settings
            later = stretches[index + 1 :]
            end = later[0].first_at if later else _FOREVER
        if end > start:
            windows.append((start, end, row.max_block_age_ms, row))
    return windows


def _within_age_bound(
    ledger: Sequence[LedgerRow], windows: Sequence[BoundWindow], layout: Layout
) -> Iterable[Violation]:
    """I7 (docs/design.md §12): no block handed out while a bound was in force carries a
    first ID older than that bound at its hand-out.

    The hand-out time is the ledger's ``claimed_at`` (the claim's statement time, database
    clock); voids (``claimed_by`` starting with ``allocator:``) are not hand-outs; where
    windows overlap the larger bound is used. Judged against ``claimed_at`` rather than the
    later moment the claim read the bound, so a claim the database let through is never
    reported.
    """
    if not windows:
        return
    for row in ledger:
        if row.claimed_at is None or row.claimed_by is None:
            continue
        if row.claimed_by.startswith(VOID_PREFIX):
            continue
        held = [w for w in windows if w[0] <= row.claimed_at <= w[1]]
        if not held:
            continue
        try:
            born_ms = layout.decode(row.first_id).timestamp_ms
        except InvalidIdError:
            continue  # reported by _timestamps
        bound_ms = max(w[2] for w in held)
        stretch = max(held, key=lambda w: w[2])[3]
        claimed_ms = int(row.claimed_at.timestamp() * 1000)
        if born_ms < claimed_ms - bound_ms:
            why = (
                "a leader served"
                if stretch.serve_aged_without_leader
                else "the bound held without a leader too"
            )
            yield Violation(
                "I7",
                f"block {row.block_id} {_span(row)} was handed out to {row.claimed_by!r} at "
                f"{row.claimed_at.isoformat()}, {claimed_ms - born_ms} ms after its first ID's "
                f"time; the bound was {bound_ms} ms and {why} (serving stretch "
                f"{stretch.stretch_id}, token {_token(stretch)})",
            )


def _span(item: Claim | LedgerRow) -> str:
    return f"[{item.first_id}, {item.last_id}]"

"""An in-memory database for nodes and their leader's jobs (the :class:`~allocator.node.seams.
NodeStore` and :class:`~allocator.node.seams.LeaderStore` ports), held to the real store by
tests/contract/test_store_contract.py: the same cases run against it and
:class:`allocator.postgres.store.NodeDatabase`.

:class:`FakeDatabase` is the one database all nodes of a test share (thread-safe);
:class:`FakeStore` is one node's connection to it. Each public method of
:class:`FakeDatabase` follows the SQL function of the same name (docs/design.md §6); where
the fake deliberately differs, its docstring says so.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Literal

from allocator.core.errors import (
    BehindHighWaterError,
    ClockAheadError,
    DatabaseBehindError,
    DatabaseUnavailableError,
    FencedError,
    InvalidBatchError,
    LayoutMismatchError,
    StaleTakeoverError,
    WriteAbandonedError,
)
from allocator.core.layout import Layout
from allocator.core.records import (
    BlockAgeBound,
    BlockAgeStatus,
    ClaimedBlock,
    ClockReading,
    CommitCheck,
    CutResult,
    FenceState,
    PoolStatus,
    Rebase,
    Replication,
    Takeover,
    TermRecord,
)
from allocator.fence import BIGINT_MAX, Token, Watermark
from allocator.postgres import compat
from allocator.postgres.compat import SchemaStamp
from allocator.postgres.store import refuse_behind

LayoutRecord = Mapping[str, int]
"""What the database records of a layout: :meth:`Layout.record` (migration 0003)."""

DEFAULT_LAYOUT: LayoutRecord = Layout().record(0)
NO_FENCE = Token(0, 0)
DEFAULT_MAX_CLOCK_AHEAD_MS = 1000
VOIDED_BY = "allocator:voided-aged"
MAX_EXTRA_TICKETS = 32
"""Aged blocks one claim voids at most before it gives up on its tickets (migration 0011)."""
SAMPLE_WINDOW_MS = (1_000, 60_000)
"""The age of the pool sample the claim rate is measured from (pool_status_row)."""

Outcome = Literal["taken", "stale", "layout_mismatch", "unreachable", "behind"]


def system_clock_ms() -> float:
    """The database server's clock, Unix milliseconds with microseconds (``clock_timestamp()``)."""
    return time.time_ns() / 1_000_000


def _utc(ms: float) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


@dataclasses.dataclass(frozen=True)
class FakeBlock:
    """One row of ``allocator.blocks``."""

    block_id: int
    ticket: int
    first_id: int
    last_id: int
    generation: int
    epoch: int
    cut_at_ms: float
    claimed_by: str | None = None
    claimed_at_ms: float | None = None


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """The one row of ``allocator.block_age``."""

    bound: BlockAgeBound
    at_ms: float
    token: Token


@dataclasses.dataclass
class _State:
    """Everything a transaction may change; a write works on a copy and commits by swapping."""

    fence: FenceState
    layout: dict[str, int] | None
    terms: list[TermRecord]
    blocks: dict[int, FakeBlock]
    next_block_id: int = 1
    last_id: int = -1
    last_ticket: int = 0
    marked_at_ms: float | None = None
    requeued_upto: int = 0
    requeue_mark: int = 0
    claim_position: int = 0
    voided_position: int = 0
    heartbeat: Heartbeat | None = None
    samples: list[tuple[float, int, int]] = dataclasses.field(default_factory=list)
    """(sampled_at_ms, claim_position, voided_position), oldest first."""

    def copy(self) -> _State:
        return dataclasses.replace(
            self,
            layout=None if self.layout is None else dict(self.layout),
            terms=list(self.terms),
            blocks=dict(self.blocks),
            samples=list(self.samples),
        )


class FakeDatabase:
    """The PostgreSQL server of one test: the fence, the leader history, the layout, the
    blocks, the claim tickets, the heartbeat.

    ``now_ms`` is the database server's clock (default: the system's): it stamps terms,
    cuts, claims and heartbeats and judges the cut's clock rule, retention and the age bound.
    A test that needs time to pass without waiting passes a clock it moves.
    """

    def __init__(
        self,
        *,
        fence: Token = NO_FENCE,
        layout: LayoutRecord | None = None,
        now_ms: Callable[[], float] = system_clock_ms,
    ) -> None:
        self._lock = threading.RLock()
        self.now_ms = now_ms
        self._state = _State(
            fence=FenceState(epoch=fence.epoch, holder=None, generation=fence.generation),
            layout=None if layout is None else dict(layout),
            terms=[],
            blocks={},
        )
        self.heartbeats: list[tuple[Token, BlockAgeBound]] = []
        """Every heartbeat committed, oldest first."""
        self.voids: list[tuple[Token, int]] = []
        """Every void committed: its token and its lead (``ahead_ms``)."""
        self._pending: list[Callable[[], None]] = []

    # -- what tests read and set -----------------------------------------------------------

    @property
    def layout(self) -> dict[str, int] | None:
        """The layout the database recorded (None until the first takeover or cut)."""
        with self._lock:
            return self._state.layout

    @layout.setter
    def layout(self, record: LayoutRecord | None) -> None:
        with self._lock:
            self._state.layout = None if record is None else dict(record)

    @property
    def high_water_id(self) -> int:
        with self._lock:
            return self._state.last_id

    @high_water_id.setter
    def high_water_id(self, mark: int) -> None:
        """Set the mark as an operator's reset or a restore would (tests only)."""
        with self._lock:
            self._state.last_id = mark

    def blocks(self) -> list[FakeBlock]:
        """Every block, in ticket order."""
        with self._lock:
            return sorted(self._state.blocks.values(), key=lambda b: b.ticket)

    # -- the fence -------------------------------------------------------------------------

    def take_fence(
        self,
        token: Token,
        holder: str,
        host: str,
        pid: int,
        layout: LayoutRecord,
        watermark: Watermark | None = None,
    ) -> Takeover:
        """``allocator.take_fence``: the watermark compared first (the store compares it on
        ``take_fence``'s answer before commit: either way nothing is written), then the
        arguments, the layout (recorded if none), the fence moved forward only, every open
        term ended ``superseded`` and the new one recorded."""
        with self._transaction(None, "take the fence") as state:
            if watermark is not None:
                refuse_behind(state.fence.token, state.last_id, watermark)
            if token.generation < 0 or token.epoch <= 0 or not holder:
                raise InvalidBatchError(
                    "take_fence needs a generation >= 0, a positive epoch and a holder name"
                )
            _check_layout(state, layout)
            previous = state.fence
            if previous.token >= token:
                raise StaleTakeoverError(
                    f"stale takeover: token {token} is not newer than the fence {previous.token}"
                )
            now = _utc(self.now_ms())
            state.fence = FenceState(epoch=token.epoch, holder=holder, generation=token.generation)
            _end_open_terms(state, "superseded", now)
            state.terms.append(
                TermRecord(token.epoch, holder, host, pid, now, None, None, token.generation)
            )
            return Takeover(state.last_id, previous.generation, previous.epoch)

    def end_term(self, token: Token, reason: str) -> bool:
        """``allocator.end_term``: ends the open term of exactly that token, once."""
        with self._transaction(None, "end the term") as state:
            for index, term in enumerate(state.terms):
                if (term.generation, term.epoch) == token and term.ended_at is None:
                    ended = _utc(self.now_ms())
                    state.terms[index] = dataclasses.replace(
                        term, ended_at=ended, end_reason=reason or "ended"
                    )
                    return True
            return False

    def rebase(self) -> Rebase:
        """``allocator fence rebase``: the next generation, from epoch 0, no holder."""
        with self._transaction(None, "rebase the fence") as state:
            old = state.fence
            state.fence = FenceState(epoch=0, holder=None, generation=old.generation + 1)
            _end_open_terms(state, "rebased", _utc(self.now_ms()))
            return Rebase(old.generation, old.epoch, old.generation + 1)

    def fence(self) -> FenceState:
        with self._lock:
            state = self._state
            return dataclasses.replace(state.fence, high_water_id=state.last_id)

    def history(self) -> list[TermRecord]:
        """Every term, oldest first."""
        with self._lock:
            return list(self._state.terms)

    def term_of(self, token: Token) -> TermRecord | None:
        with self._lock:
            return next((t for t in self._state.terms if (t.generation, t.epoch) == token), None)

    # -- fenced writes -----------------------------------------------------------------------

    def cut_blocks(
        self,
        token: Token,
        ranges: Sequence[tuple[int, int]],
        layout: LayoutRecord,
        max_ahead_ms: int = DEFAULT_MAX_CLOCK_AHEAD_MS,
        commit_if: CommitCheck | None = None,
    ) -> CutResult:
        """``allocator.cut_blocks``, checks in its order: the fence (AL100), the batch's shape
        and order (AL103), the layout and datacenter (AL104), strictly after the mark (AL102),
        no block past the database clock plus ``max(max_ahead_ms, the mark's lead at its
        cut)`` (AL105); tickets continue after every ticket drawn; the mark moves to the
        batch's last ID."""
        with self._transaction(commit_if, "cut blocks") as state:
            _lock_fence(state, token)
            if not ranges:
                raise InvalidBatchError("block batch must be two non-empty arrays")
            if max_ahead_ms < 0:
                raise InvalidBatchError(f"max_ahead_ms must be >= 0 (got {max_ahead_ms})")
            previous_last: int | None = None
            for first, last in ranges:
                if (
                    first < 0
                    or last < first
                    or (previous_last is not None and first <= previous_last)
                ):
                    raise InvalidBatchError(
                        "block batch must be ascending, non-overlapping ranges with "
                        "0 <= first <= last"
                    )
                previous_last = last
            recorded, datacenter = _check_layout(state, layout)
            for first, last in ranges:
                head, tail = recorded.decode(first), recorded.decode(last)
                if head.datacenter != datacenter or (head.timestamp_ms, head.datacenter) != (
                    tail.timestamp_ms,
                    tail.datacenter,
                ):
                    raise LayoutMismatchError(f"block outside datacenter {datacenter}")
            if ranges[0][0] <= state.last_id:
                raise BehindHighWaterError(
                    f"block {ranges[0][0]} starts at or behind the high-water mark {state.last_id}"
                )
            db_now = self.now_ms()
            now_ms = math.floor(db_now)
            previous_lead = 0
            if state.last_id >= 0 and state.marked_at_ms is not None:
                previous_lead = max(
                    0, recorded.decode(state.last_id).timestamp_ms - math.floor(state.marked_at_ms)
                )
            allowed_ms = now_ms + max(max_ahead_ms, previous_lead)
            last_ms = recorded.decode(ranges[-1][1]).timestamp_ms
            if last_ms > allowed_ms:
                raise ClockAheadError(
                    f"clock ahead: block {ranges[-1][1]} carries {last_ms} ms, "
                    f"{last_ms - now_ms} ms past the database clock"
                )
            first_ticket = max(state.last_ticket, state.claim_position) + 1
            for offset, (first, last) in enumerate(ranges):
                block_id = state.next_block_id + offset
                state.blocks[block_id] = FakeBlock(
                    block_id,
                    first_ticket + offset,
                    first,
                    last,
                    token.generation,
                    token.epoch,
                    db_now,
                )
            state.next_block_id += len(ranges)
            state.last_id = ranges[-1][1]
            state.last_ticket = first_ticket + len(ranges) - 1
            state.marked_at_ms = db_now
            return CutResult(state.last_id, state.last_ticket, max(0, last_ms - now_ms))

    def requeue_stranded(self, token: Token, commit_if: CommitCheck | None = None) -> int:
        """``allocator.requeue_stranded``: the unclaimed blocks of the window
        ``(requeued_upto, requeue_mark]`` get fresh tickets; the window moves on to the
        tickets drawn since. (No claim is ever in flight here, so none is held.)"""
        with self._transaction(commit_if, "requeue stranded blocks") as state:
            _lock_fence(state, token)
            movable = sorted(
                (
                    b
                    for b in state.blocks.values()
                    if state.requeued_upto < b.ticket <= state.requeue_mark
                    and b.claimed_at_ms is None
                ),
                key=lambda b: b.ticket,
            )
            first_ticket = max(state.last_ticket, state.claim_position) + 1
            for k, block in enumerate(movable):
                state.blocks[block.block_id] = dataclasses.replace(block, ticket=first_ticket + k)
            if movable:
                state.last_ticket = first_ticket + len(movable) - 1
            state.requeued_upto = state.requeue_mark
            state.requeue_mark = state.claim_position
            return len(movable)

    def prune_claimed(
        self, token: Token, retention_ms: int, limit: int, commit_if: CommitCheck | None = None
    ) -> int:
        """``allocator.prune_claimed``: at most ``limit`` blocks claimed before the database
        clock minus ``retention_ms``, oldest tickets first; never an unclaimed one."""
        with self._transaction(commit_if, "prune claimed blocks") as state:
            _lock_fence(state, token)
            if retention_ms < 0 or limit < 1:
                raise InvalidBatchError(
                    f"prune_claimed needs a retention >= 0 ms and a limit >= 1 "
                    f"(got {retention_ms}, {limit})"
                )
            cutoff = self.now_ms() - retention_ms
            old = sorted(
                (
                    b
                    for b in state.blocks.values()
                    if b.claimed_at_ms is not None and b.claimed_at_ms < cutoff
                ),
                key=lambda b: b.ticket,
            )[:limit]
            for block in old:
                del state.blocks[block.block_id]
            return len(old)

    def leader_heartbeat(
        self, token: Token, bound: BlockAgeBound, commit_if: CommitCheck | None = None
    ) -> datetime:
        """``allocator.leader_heartbeat``: the bound and the time, by the database clock.
        (Serving stretches are not kept; :attr:`heartbeats` lists what was written.)"""
        with self._transaction(commit_if, "write the leader heartbeat") as state:
            _lock_fence(state, token)
            if bound.max_block_age_ms < 1 or bound.leader_stale_ms < 1:
                raise InvalidBatchError(
                    "leader_heartbeat needs a max_block_age_ms >= 1 and a leader_stale_ms >= 1"
                )
            at_ms = self.now_ms()
            state.heartbeat = Heartbeat(bound, at_ms, token)
            self._on_commit(lambda: self.heartbeats.append((token, bound)))
            return _utc(at_ms)

    def void_aged_blocks(
        self, token: Token, ahead_ms: int, limit: int, commit_if: CommitCheck | None = None
    ) -> int:
        """``allocator.void_aged_blocks``: at most ``limit`` unclaimed blocks older than the
        bound minus ``ahead_ms``, oldest first, claimed by ``allocator:voided-aged``; the
        claim tickets are drawn past them up to the first block still unclaimed. Nothing
        without a heartbeat or a layout."""
        with self._transaction(commit_if, "void aged blocks") as state:
            _lock_fence(state, token)
            max_age = None if state.heartbeat is None else state.heartbeat.bound.max_block_age_ms
            if ahead_ms < 0 or limit < 1 or (max_age is not None and ahead_ms >= max_age):
                raise InvalidBatchError(
                    f"void_aged_blocks needs 0 <= ahead_ms < max_block_age_ms ({max_age}) and "
                    f"a limit >= 1 (got {ahead_ms}, {limit})"
                )
            below_id = self._age_bound_id(state, ahead_ms, always=True)
            if below_id is None:
                return 0
            aged = sorted(
                (
                    b
                    for b in state.blocks.values()
                    if b.ticket > state.requeued_upto
                    and b.claimed_at_ms is None
                    and b.first_id < below_id
                ),
                key=lambda b: b.first_id,
            )[:limit]
            now = self.now_ms()
            for block in aged:
                state.blocks[block.block_id] = dataclasses.replace(
                    block, claimed_by=VOIDED_BY, claimed_at_ms=now
                )
            if aged:
                last_ticket = max(b.ticket for b in aged)
                fresh = [
                    b.ticket
                    for b in state.blocks.values()
                    if b.ticket > state.claim_position and b.claimed_at_ms is None
                ]
                target = min(last_ticket, min(fresh) - 1) if fresh else last_ticket
                if target > state.claim_position:
                    state.voided_position += target - state.claim_position
                    state.claim_position = target
            self._on_commit(lambda: self.voids.append((token, ahead_ms)))
            return len(aged)

    def record_pool_sample(self) -> None:
        """``allocator.record_pool_sample``: one sample of the ticket positions; an hour kept."""
        with self._transaction(None, "record a pool sample") as state:
            now = self.now_ms()
            state.samples = [s for s in state.samples if s[0] >= now - 3_600_000]
            state.samples.append((now, state.claim_position, state.voided_position))

    # -- reads -------------------------------------------------------------------------------

    def pool_status(self) -> PoolStatus:
        """``allocator.pool_status``. (Claims are never paused here.)"""
        with self._lock:
            state, now = self._state, self.now_ms()
            available = self._unclaimed(state)
            rate = None
            window = [
                s
                for s in state.samples
                if now - SAMPLE_WINDOW_MS[1] <= s[0] <= now - SAMPLE_WINDOW_MS[0]
            ]
            if window:
                at_ms, position, voided = window[0]
                handed_out = (state.claim_position - state.voided_position) - (position - voided)
                rate = handed_out / ((now - at_ms) / 1000)
            mark_ms = self._id_time_ms(state, state.last_id)
            return PoolStatus(
                available_blocks=len(available),
                available_ids=sum(b.last_id - b.first_id + 1 for b in available),
                claim_rate_blocks_per_s=rate,
                runway_s=len(available) / rate if rate is not None and rate > 0 else None,
                high_water_id=state.last_id,
                cut_position=state.last_ticket,
                claim_position=state.claim_position,
                epoch=state.fence.epoch,
                holder=state.fence.holder,
                generation=state.fence.generation,
                mark_ahead_ms=None if mark_ms is None else mark_ms - math.floor(now),
                mark_lead_ms=(
                    None
                    if mark_ms is None or state.marked_at_ms is None
                    else mark_ms - math.floor(state.marked_at_ms)
                ),
            )

    def block_age_status(self) -> BlockAgeStatus:
        """``allocator.block_age_status``."""
        with self._lock:
            state, now = self._state, self.now_ms()
            unclaimed = self._unclaimed(state)
            oldest = min((b.first_id for b in unclaimed), default=None)
            oldest_ms = None if oldest is None else self._id_time_ms(state, oldest)
            age = None if oldest_ms is None else math.floor(now) - oldest_ms
            beat = state.heartbeat
            if beat is None:
                return BlockAgeStatus(None, None, None, False, age)
            return BlockAgeStatus(
                beat.bound.max_block_age_ms,
                beat.bound.serve_aged_without_leader,
                _utc(beat.at_ms),
                beat.at_ms >= now - beat.bound.leader_stale_ms,
                age,
            )

    def claimed_block_ages(
        self, after_ticket: int, upto_ticket: int, limit: int
    ) -> list[ClaimedBlock]:
        """``allocator.claimed_block_ages``: hand-outs by ticket, newest first, voids left out."""
        with self._lock:
            chosen = [
                b
                for b in self._state.blocks.values()
                if after_ticket < b.ticket <= upto_ticket
                and b.claimed_at_ms is not None
                and not (b.claimed_by or "").startswith("allocator:")
            ]
            chosen.sort(key=lambda b: b.ticket, reverse=True)
            return [
                ClaimedBlock(b.ticket, b.first_id, math.floor(b.claimed_at_ms or 0))
                for b in chosen[: max(limit, 0)]
            ]

    # -- a consumer's side (not a port: what the contract tests set the scene with) -----------

    def claim(self, consumer: str, n: int = 1) -> list[tuple[int, int]]:
        """``allocator.claim_blocks`` as an application calls it: ``n`` tickets drawn, the
        blocks carrying them claimed (an aged one, while a bound is in force, voided and
        another ticket drawn, at most 32 extra), then the oldest stranded blocks of the
        requeue window. Returns ``(first_id, last_id)`` in ID order; fewer when the pool runs
        short. (Tickets are drawn one at a time; no pause, no argument checks.)"""
        with self._transaction(None, "claim blocks") as state:
            now = self.now_ms()
            bound_id = self._age_bound_id(state, 0, always=False)
            by_ticket = {b.ticket: b for b in state.blocks.values()}
            won: list[FakeBlock] = []
            want, extra = n, 0
            while True:
                drawn = range(state.claim_position + 1, state.claim_position + want + 1)
                state.claim_position += want
                found = [by_ticket[t] for t in drawn if t in by_ticket]
                unclaimed = [b for b in found if b.claimed_at_ms is None]
                won += [b for b in unclaimed if bound_id is None or b.first_id >= bound_id]
                if bound_id is None or len(won) >= n:
                    break
                for block in unclaimed:
                    if block.first_id < bound_id:
                        state.blocks[block.block_id] = dataclasses.replace(
                            block, claimed_by=VOIDED_BY, claimed_at_ms=now
                        )
                skipped = sum(1 for b in found if state.blocks[b.block_id].claimed_by == VOIDED_BY)
                state.voided_position += skipped
                want = min(skipped, MAX_EXTRA_TICKETS - extra, n - len(won))
                if want <= 0:
                    break
                extra += want
            stranded = sorted(
                (
                    b
                    for b in state.blocks.values()
                    if state.requeued_upto < b.ticket <= state.requeue_mark
                    and b.claimed_at_ms is None
                    and (bound_id is None or b.first_id >= bound_id)
                    and b not in won
                ),
                key=lambda b: b.ticket,
            )
            won += stranded[: n - len(won)]
            for block in won:
                state.blocks[block.block_id] = dataclasses.replace(
                    block, claimed_by=consumer, claimed_at_ms=now
                )
            return sorted((b.first_id, b.last_id) for b in won)

    def draw_tickets(self, n: int = 1) -> None:
        """A claim that drew ``n`` tickets and rolled back: its blocks stay unclaimed below the
        claim position (stranded), as the sequence is not transactional."""
        with self._transaction(None, "draw tickets") as state:
            state.claim_position += n

    # -- the transaction ---------------------------------------------------------------------

    @contextmanager
    def _transaction(self, commit_if: CommitCheck | None, what: str) -> Iterator[_State]:
        """One statement in its own transaction: it works on a copy of the state; an error
        leaves the state as it was, and so does a ``commit_if`` that says no (asked after
        the statement, right before COMMIT, as the store does): :class:`WriteAbandonedError`.
        The claim tickets drawn stay drawn either way: ``nextval`` is not transactional."""
        with self._lock:
            self._pending = []
            draft = self._state.copy()
            try:
                yield draft
                if commit_if is not None and not commit_if():
                    raise WriteAbandonedError(f"{what}: abandoned before commit (fake)")
            except BaseException:
                self._state.claim_position = draft.claim_position
                self._state.voided_position = draft.voided_position
                raise
            self._state = draft
            for effect in self._pending:
                effect()

    def _on_commit(self, effect: Callable[[], None]) -> None:
        self._pending.append(effect)

    def _unclaimed(self, state: _State) -> list[FakeBlock]:
        """``available_blocks``' rule: unclaimed with a ticket above the requeue floor."""
        return [
            b
            for b in state.blocks.values()
            if b.ticket > state.requeued_upto and b.claimed_at_ms is None
        ]

    def _id_time_ms(self, state: _State, snowflake_id: int) -> int | None:
        """``allocator.id_time_ms``: None without a layout or for a negative ID."""
        if state.layout is None or snowflake_id < 0:
            return None
        return _layout_of(state.layout).decode(snowflake_id).timestamp_ms

    def _age_bound_id(self, state: _State, ahead_ms: int, *, always: bool) -> int | None:
        """``allocator.age_bound_id``: the lowest first ID not aged now, or None when no bound
        is in force."""
        beat = state.heartbeat
        if beat is None or state.layout is None:
            return None
        now = self.now_ms()
        serving = beat.at_ms >= now - beat.bound.leader_stale_ms
        if not (always or not beat.bound.serve_aged_without_leader or serving):
            return None
        layout = _layout_of(state.layout)
        offset = math.floor(now) - (beat.bound.max_block_age_ms - ahead_ms) - layout.epoch_ms
        offset = max(0, min(offset, (1 << layout.timestamp_bits) - 1))
        return layout.encode(layout.epoch_ms + offset, 0, 0, 0)


def _layout_of(record: Mapping[str, int]) -> Layout:
    return Layout(
        epoch_ms=record["epoch_ms"],
        timestamp_bits=record["timestamp_bits"],
        datacenter_bits=record["datacenter_bits"],
        lane_bits=record["lane_bits"],
        sequence_bits=record["sequence_bits"],
    )


def _check_layout(state: _State, layout: LayoutRecord) -> tuple[Layout, int]:
    """``allocator.check_layout``: records the layout if none is, else it must be the same."""
    if state.layout is None:
        state.layout = dict(layout)
    elif dict(layout) != state.layout:
        raise LayoutMismatchError(
            f"layout mismatch: this node has {dict(layout)}, the database recorded {state.layout}"
        )
    return _layout_of(state.layout), state.layout["datacenter_id"]


def _lock_fence(state: _State, token: Token) -> None:
    """``allocator.lock_fence``: the exact token, or fenced (AL100)."""
    if state.fence.token != token:
        raise FencedError(f"fenced: token {token} does not hold the fence (fake)")


def _end_open_terms(state: _State, reason: str, now: datetime) -> None:
    state.terms = [
        dataclasses.replace(t, ended_at=now, end_reason=reason) if t.ended_at is None else t
        for t in state.terms
    ]


class FakeStore:
    """One node's connection to a :class:`FakeDatabase`: the ``NodeStore`` and
    ``LeaderStore`` ports, as :class:`~allocator.postgres.store.NodeDatabase` serves them.

    ``reachable = False`` makes every call raise :class:`DatabaseUnavailableError`, as a node
    cut off from the database sees. Deliberate differences from the real store:

    - ``read_clock`` reads the node's clock (the ``now_ms`` it is given) and reports
      ``clock_offset_ms`` exactly (uncertainty 0); the database's own clock is
      :attr:`FakeDatabase.now_ms`.
    - ``available_blocks``, when set, is what ``pool_status`` reports instead of counting
      (the node's tests, whose fake jobs cut nothing, script a full or empty pool with it).
    - ``replication`` answers :attr:`replication_status` (a database without standbys).
    """

    def __init__(
        self,
        database: FakeDatabase,
        *,
        layout: LayoutRecord = DEFAULT_LAYOUT,
        clock_offset_ms: float = 0.0,
        max_clock_ahead_ms: int = DEFAULT_MAX_CLOCK_AHEAD_MS,
        available_blocks: int | None = None,
    ) -> None:
        self.database = database
        self.layout = layout
        self.max_clock_ahead_ms = max_clock_ahead_ms
        self.reachable = True
        self.clock_offset_ms = clock_offset_ms
        self.available_blocks = available_blocks
        self.replication_status = Replication(0, 0, "", "on", False)
        self.schema = SchemaStamp(compat.HEAD, compat.contract_floor(compat.HEAD))
        """What :meth:`schema_stamp` answers (a test sets another schema)."""
        self.opened = False
        self.closed = False
        self._lock = threading.Lock()
        self.takeovers: list[tuple[Token, Outcome]] = []
        """Every ``take_fence`` this node asked for, with what came of it."""

    def open(self, timeout: float | None = None) -> None:
        self._check_reachable("open the node database pool")
        self.opened = True

    def close(self, timeout: float = 5.0) -> None:
        self.closed = True

    # -- the fence ---------------------------------------------------------------------------

    def take_fence(
        self,
        token: Token,
        holder: str,
        host: str,
        pid: int,
        watermark: Watermark | None = None,
    ) -> Takeover:
        outcome: Outcome = "unreachable"
        try:
            self._check_reachable("take the fence")
            takeover = self.database.take_fence(token, holder, host, pid, self.layout, watermark)
            outcome = "taken"
            return takeover
        except DatabaseBehindError:
            outcome = "behind"
            raise
        except StaleTakeoverError:
            outcome = "stale"
            raise
        except LayoutMismatchError:
            outcome = "layout_mismatch"
            raise
        finally:
            with self._lock:
                self.takeovers.append((token, outcome))

    def end_term(self, token: Token, reason: str) -> bool:
        self._check_reachable("end the term")
        return self.database.end_term(token, reason)

    def fence(self) -> FenceState:
        self._check_reachable("read the fence")
        return self.database.fence()

    def high_water_id(self) -> int:
        self._check_reachable("read the high-water mark")
        return self.database.fence().high_water_id

    def leader_history(self, limit: int) -> list[TermRecord]:
        self._check_reachable("read the leader history")
        return self.database.history()[::-1][:limit]

    # -- fenced writes -----------------------------------------------------------------------

    def cut_blocks(
        self,
        token: Token,
        ranges: Sequence[tuple[int, int]],
        commit_if: CommitCheck | None = None,
    ) -> CutResult:
        self._check_reachable("cut blocks")
        if any(not 0 <= value <= BIGINT_MAX for block in ranges for value in block):
            raise InvalidBatchError("cut blocks: every ID must be in 0..2^63-1")
        return self.database.cut_blocks(
            token, ranges, self.layout, self.max_clock_ahead_ms, commit_if
        )

    def requeue_stranded(self, token: Token, commit_if: CommitCheck | None = None) -> int:
        self._check_reachable("requeue stranded blocks")
        return self.database.requeue_stranded(token, commit_if)

    def prune_claimed(
        self,
        token: Token,
        retention_s: float,
        limit: int,
        commit_if: CommitCheck | None = None,
    ) -> int:
        if retention_s < 0:
            raise ValueError(f"retention_s must be >= 0 (got {retention_s})")
        self._check_reachable("prune claimed blocks")
        return self.database.prune_claimed(token, round(retention_s * 1000), limit, commit_if)

    def leader_heartbeat(
        self, token: Token, bound: BlockAgeBound, commit_if: CommitCheck | None = None
    ) -> datetime:
        self._check_reachable("write the leader heartbeat")
        return self.database.leader_heartbeat(token, bound, commit_if)

    def void_aged_blocks(
        self, token: Token, ahead_ms: int, limit: int, commit_if: CommitCheck | None = None
    ) -> int:
        self._check_reachable("void aged blocks")
        return self.database.void_aged_blocks(token, ahead_ms, limit, commit_if)

    def record_pool_sample(self) -> None:
        self._check_reachable("record a pool sample")
        self.database.record_pool_sample()

    # -- reads -------------------------------------------------------------------------------

    def schema_stamp(self) -> SchemaStamp:
        self._check_reachable("read the schema revision")
        return self.schema

    def read_clock(self, now_ms: Callable[[], float]) -> ClockReading:
        self._check_reachable("read the database clock")
        node_ms = now_ms()
        return ClockReading(
            offset_ms=self.clock_offset_ms,
            uncertainty_ms=0.0,
            db_ms=round(node_ms + self.clock_offset_ms),
        )

    def pool_status(self) -> PoolStatus:
        self._check_reachable("read the pool status")
        status = self.database.pool_status()
        if self.available_blocks is None:
            return status
        return dataclasses.replace(
            status,
            available_blocks=self.available_blocks,
            available_ids=self.available_blocks * 4096,
        )

    def block_age_status(self) -> BlockAgeStatus:
        self._check_reachable("read the block age status")
        return self.database.block_age_status()

    def claimed_block_ages(
        self, after_ticket: int, upto_ticket: int, limit: int
    ) -> list[ClaimedBlock]:
        self._check_reachable("read the blocks handed out")
        return self.database.claimed_block_ages(after_ticket, upto_ticket, limit)

    def replication(self) -> Replication:
        self._check_reachable("read the replication status")
        return self.replication_status

    def outcomes(self) -> list[Outcome]:
        with self._lock:
            return [outcome for _token, outcome in self.takeovers]

    def _check_reachable(self, what: str) -> None:
        if not self.reachable:
            raise DatabaseUnavailableError(f"{what}: the database is unreachable (fake)")

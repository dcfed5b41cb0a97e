"""An in-memory database for nodes: the fence, the leader history, the recorded layout, and
each node's view of it (the :class:`allocator.node.seams.NodeStore` port).

Rules of the fake (those of ``allocator.take_fence``, ``end_term`` and ``rebase_fence`` in
migrations/sql/0003 that the node depends on):

- :class:`FakeDatabase` is the one database all nodes of a test share; it is thread-safe.
- ``take_fence`` first compares the database with the watermark it is given, in the same
  step (as the real one does in its transaction): a database below it raises
  :class:`DatabaseBehindError` and nothing changes. It moves the fence forward only: the new
  token ``(generation, epoch)`` must be greater than the fence's, as a pair, else
  :class:`StaleTakeoverError`. It ends every open
  term (``superseded``) and records the new one. The first takeover records the node's
  layout; a takeover with another layout raises :class:`LayoutMismatchError`.
- ``end_term`` ends the open term of exactly that token, once (False otherwise).
- ``rebase`` is the operator's ``allocator fence rebase``: generation + 1, epoch 0, no
  holder, open terms ended ``rebased``.
- ``leader_heartbeat`` and ``void_aged_blocks`` (migration 0011) are fenced on the exact
  token (:class:`FencedError` otherwise). The heartbeat is recorded (``heartbeats``); the
  fake keeps no blocks, only a count of aged ones (``aged_blocks``), of which a void takes
  at most its limit (and records its lead, ``voids``). A ``commit_if`` that says no makes
  them raise :class:`WriteAbandonedError` with nothing written.
- ``block_age_status`` answers ``block_age``; ``claimed_block_ages`` selects from
  ``claimed`` by ticket as the real function does (newest first, at most the limit; the
  fake holds no voided blocks); ``pool_status`` reports ``claim_position``.
- :class:`FakeStore` is one node's connection. ``reachable = False`` makes every call raise
  :class:`DatabaseUnavailableError`, as a node cut off from the database sees.
  ``clock_offset_ms`` is how far the database server's clock is from this node's: ``read_clock``
  reads the node's clock (the ``now_ms`` it is given) and reports that offset, exactly.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

from allocator.core.errors import (
    DatabaseBehindError,
    DatabaseUnavailableError,
    FencedError,
    InvalidBatchError,
    LayoutMismatchError,
    StaleTakeoverError,
    WriteAbandonedError,
)
from allocator.core.records import (
    BlockAgeBound,
    BlockAgeStatus,
    ClaimedBlock,
    ClockReading,
    CommitCheck,
    FenceState,
    PoolStatus,
    Takeover,
    TermRecord,
)
from allocator.fence import Token, Watermark, database_behind
from allocator.postgres.operator import Rebase

DEFAULT_LAYOUT = "default layout"
NO_FENCE = Token(0, 0)

Outcome = Literal["taken", "stale", "layout_mismatch", "unreachable", "behind"]


class FakeDatabase:
    """The PostgreSQL server of one test, reduced to the fence and the leader history."""

    def __init__(self, *, fence: Token = NO_FENCE, layout: str | None = None) -> None:
        self._lock = threading.Lock()
        self._fence = FenceState(epoch=fence.epoch, holder=None, generation=fence.generation)
        self.layout = layout
        """The layout the database recorded (None until the first takeover records one)."""
        self._terms: list[TermRecord] = []
        self.high_water_id = -1
        self.heartbeats: list[tuple[Token, BlockAgeBound]] = []
        """Every heartbeat written, oldest first."""
        self.aged_blocks = 0
        """Unclaimed blocks past the bound (minus any lead): what a void takes."""
        self.voids: list[tuple[Token, int]] = []
        """Every void that ran: its token and its lead (``ahead_ms``)."""

    def take_fence(
        self,
        token: Token,
        holder: str,
        host: str,
        pid: int,
        layout: str,
        watermark: Watermark | None = None,
    ) -> Takeover:
        with self._lock:
            held = self._fence.token
            behind = database_behind(held, self.high_water_id, watermark)
            if behind is not None:
                raise DatabaseBehindError(
                    behind,
                    generation=held.generation,
                    epoch=held.epoch,
                    high_water_id=self.high_water_id,
                )
            if token.epoch <= 0 or not holder:
                raise InvalidBatchError(f"take_fence needs a positive epoch and a holder: {token}")
            if self.layout is None:
                self.layout = layout
            elif layout != self.layout:
                raise LayoutMismatchError(
                    f"the database recorded the layout {self.layout!r}, not {layout!r}"
                )
            previous = self._fence
            if previous.token >= token:
                raise StaleTakeoverError(
                    f"stale takeover: token {token} is not newer than the fence {previous.token}"
                )
            self._fence = FenceState(epoch=token.epoch, holder=holder, generation=token.generation)
            now = datetime.now(UTC)
            self._end_open_terms("superseded", now)
            self._terms.append(
                TermRecord(
                    epoch=token.epoch,
                    holder=holder,
                    host=host,
                    pid=pid,
                    elected_at=now,
                    ended_at=None,
                    end_reason=None,
                    generation=token.generation,
                )
            )
            return Takeover(
                high_water_id=self.high_water_id,
                previous_generation=previous.generation,
                previous_epoch=previous.epoch,
            )

    def end_term(self, token: Token, reason: str) -> bool:
        with self._lock:
            for index, term in enumerate(self._terms):
                if (term.generation, term.epoch) == token and term.ended_at is None:
                    self._terms[index] = dataclasses.replace(
                        term, ended_at=datetime.now(UTC), end_reason=reason or "ended"
                    )
                    return True
            return False

    def rebase(self) -> Rebase:
        """``allocator fence rebase``: the next generation, from epoch 0."""
        with self._lock:
            old = self._fence
            self._fence = FenceState(epoch=0, holder=None, generation=old.generation + 1)
            self._end_open_terms("rebased", datetime.now(UTC))
            return Rebase(
                old_generation=old.generation,
                old_epoch=old.epoch,
                new_generation=old.generation + 1,
            )

    def fence(self) -> FenceState:
        with self._lock:
            return dataclasses.replace(self._fence, high_water_id=self.high_water_id)

    def leader_heartbeat(self, token: Token, bound: BlockAgeBound) -> datetime:
        with self._lock:
            self._lock_fence(token)
            self.heartbeats.append((token, bound))
            return datetime.now(UTC)

    def void_aged_blocks(self, token: Token, ahead_ms: int, limit: int) -> int:
        with self._lock:
            self._lock_fence(token)
            voided = min(limit, self.aged_blocks)
            self.aged_blocks -= voided
            self.voids.append((token, ahead_ms))
            return voided

    def _lock_fence(self, token: Token) -> None:
        if self._fence.token != token:
            raise FencedError(f"fenced: token {token} does not hold the fence (fake)")

    def history(self) -> list[TermRecord]:
        """Every term, oldest first."""
        with self._lock:
            return list(self._terms)

    def term_of(self, token: Token) -> TermRecord | None:
        with self._lock:
            return next((t for t in self._terms if (t.generation, t.epoch) == token), None)

    def _end_open_terms(self, reason: str, now: datetime) -> None:
        self._terms = [
            dataclasses.replace(t, ended_at=now, end_reason=reason) if t.ended_at is None else t
            for t in self._terms
        ]


class FakeStore:
    """One node's connection to a :class:`FakeDatabase` (the ``NodeStore`` port)."""

    def __init__(
        self, database: FakeDatabase, *, layout: str = DEFAULT_LAYOUT, clock_offset_ms: float = 0.0
    ) -> None:
        self.database = database
        self.layout = layout
        self.reachable = True
        self.clock_offset_ms = clock_offset_ms
        self.opened = False
        self.closed = False
        self._lock = threading.Lock()
        self.takeovers: list[tuple[Token, Outcome]] = []
        """Every ``take_fence`` this node asked for, with what came of it."""
        self.available_blocks = 1_000_000
        """What ``pool_status`` reports (the fake keeps no pool)."""
        self.claim_position = 0
        """What ``pool_status`` reports as the claim position."""
        self.block_age = BlockAgeStatus(None, None, None, False, None)
        """What ``block_age_status`` reports."""
        self.claimed: list[ClaimedBlock] = []
        """The blocks handed out, by ticket: what ``claimed_block_ages`` selects from."""

    def open(self, timeout: float | None = None) -> None:
        self._check_reachable("open the node database pool")
        self.opened = True

    def close(self, timeout: float = 5.0) -> None:
        self.closed = True

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

    def leader_heartbeat(
        self, token: Token, bound: BlockAgeBound, commit_if: CommitCheck | None = None
    ) -> datetime:
        self._check_reachable("write the leader heartbeat")
        _check_commit("write the leader heartbeat", commit_if)
        return self.database.leader_heartbeat(token, bound)

    def void_aged_blocks(
        self, token: Token, ahead_ms: int, limit: int, commit_if: CommitCheck | None = None
    ) -> int:
        self._check_reachable("void aged blocks")
        _check_commit("void aged blocks", commit_if)
        return self.database.void_aged_blocks(token, ahead_ms, limit)

    def leader_history(self, limit: int) -> list[TermRecord]:
        self._check_reachable("read the leader history")
        return self.database.history()[::-1][:limit]

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
        fence = self.database.fence()
        return PoolStatus(
            available_blocks=self.available_blocks,
            available_ids=self.available_blocks * 4096,
            claim_rate_blocks_per_s=None,
            runway_s=None,
            high_water_id=fence.high_water_id,
            cut_position=0,
            claim_position=self.claim_position,
            epoch=fence.epoch,
            holder=fence.holder,
            generation=fence.generation,
        )

    def block_age_status(self) -> BlockAgeStatus:
        self._check_reachable("read the block age status")
        return self.block_age

    def claimed_block_ages(
        self, after_ticket: int, upto_ticket: int, limit: int
    ) -> list[ClaimedBlock]:
        self._check_reachable("read the blocks handed out")
        chosen = [b for b in self.claimed if after_ticket < b.ticket <= upto_ticket]
        return sorted(chosen, key=lambda b: b.ticket, reverse=True)[:limit]

    def outcomes(self) -> list[Outcome]:
        with self._lock:
            return [outcome for _token, outcome in self.takeovers]

    def _check_reachable(self, what: str) -> None:
        if not self.reachable:
            raise DatabaseUnavailableError(f"{what}: the database is unreachable (fake)")


def _check_commit(what: str, commit_if: CommitCheck | None) -> None:
    """A fenced write whose ``commit_if`` says no is rolled back: nothing of it happens."""
    if commit_if is not None and not commit_if():
        raise WriteAbandonedError(f"{what}: abandoned before commit (fake)")

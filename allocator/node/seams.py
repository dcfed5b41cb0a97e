"""The seams of a node: what :class:`~allocator.node.Node` needs from its collaborators.

The node receives every collaborator from its caller (:mod:`allocator.commands.run` for a
real node; fakes in ``tests/unit``). These protocols name exactly what the node calls, so a
fake stays small; the core never imports ``jobs``: they come in through
:class:`LeaderJobsPort`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from allocator.core.errors import AllocatorError, FencedError
from allocator.core.health import NodeHealth
from allocator.core.leadership import Term
from allocator.core.records import (
    BlockAgeBound,
    BlockAgeStatus,
    ClaimedBlock,
    ClockReading,
    CommitCheck,
    CutResult,
    FenceState,
    PoolStatus,
    Replication,
    Takeover,
    TermRecord,
)
from allocator.fence import Token, Watermark
from allocator.postgres.compat import SchemaStamp


class NodeStore(Protocol):
    """The node's own use of PostgreSQL (:class:`allocator.postgres.store.NodeDatabase` is the
    real one)."""

    def open(self, timeout: float | None = None) -> None: ...

    def close(self, timeout: float = 5.0) -> None: ...

    def take_fence(
        self,
        token: Token,
        holder: str,
        host: str,
        pid: int,
        watermark: Watermark | None = None,
    ) -> Takeover: ...

    def end_term(self, token: Token, reason: str) -> bool: ...

    def fence(self) -> FenceState: ...

    def read_clock(self, now_ms: Callable[[], float]) -> ClockReading: ...

    def schema_stamp(self) -> SchemaStamp:
        """The schema revision and its compatibility marker (:mod:`allocator.postgres.compat`)."""
        ...

    def pool_status(self) -> PoolStatus: ...

    def block_age_status(self) -> BlockAgeStatus:
        """The bound on an ID's age and the oldest block's age (the status page)."""
        ...

    def leader_history(self, limit: int) -> list[TermRecord]:
        """The latest ``limit`` terms, newest first (the status page's last handovers)."""
        ...


class LeaderStore(Protocol):
    """What the leader's jobs (:mod:`jobs`) call on PostgreSQL (the same store)."""

    def pool_status(self) -> PoolStatus: ...

    def read_clock(self, now_ms: Callable[[], float]) -> ClockReading: ...

    def replication(self) -> Replication: ...

    def record_pool_sample(self) -> None: ...

    def block_age_status(self) -> BlockAgeStatus: ...

    def claimed_block_ages(
        self, after_ticket: int, upto_ticket: int, limit: int
    ) -> list[ClaimedBlock]: ...

    def requeue_stranded(self, token: Token, commit_if: CommitCheck | None = None) -> int: ...

    def cut_blocks(
        self,
        token: Token,
        ranges: Sequence[tuple[int, int]],
        commit_if: CommitCheck | None = None,
    ) -> CutResult: ...

    def prune_claimed(
        self,
        token: Token,
        retention_s: float,
        limit: int,
        commit_if: CommitCheck | None = None,
    ) -> int: ...

    def leader_heartbeat(
        self,
        token: Token,
        bound: BlockAgeBound,
        commit_if: CommitCheck | None = None,
    ) -> datetime: ...

    def void_aged_blocks(
        self,
        token: Token,
        ahead_ms: int,
        limit: int,
        commit_if: CommitCheck | None = None,
    ) -> int: ...


@dataclass(frozen=True)
class LeaderHooks:
    """How the leader's jobs report back to the node."""

    health: NodeHealth
    on_fenced: Callable[[FencedError], None]
    """A write was rejected as fenced: the term is over."""
    on_fatal: Callable[[AllocatorError], None]
    """A write was refused for a reason no retry can fix (another layout): stop the node."""
    database_went_back: Callable[[int], bool] = lambda high_water_id: False
    """Given the database's high-water mark: True (reported) if it lies below ZooKeeper's
    watermark, i.e. the database went backwards; the job then writes nothing."""
    cut_recorded: Callable[[int], None] = lambda high_water_id: None
    """The mark after a committed cut: the node raises ZooKeeper's watermark (rate-limited)."""
    pool_read: Callable[[PoolStatus], None] = lambda status: None
    """A reading of ``pool_status`` a job made: the node's pool metrics and readiness."""


class LeaderJobsPort(Protocol):
    """The leader-only scheduled jobs (:class:`jobs.leader.LeaderJobs` is the real one)."""

    def start_scheduler(self) -> None: ...

    def shutdown(self) -> None: ...

    def start(self, term: Term, hooks: LeaderHooks) -> None:
        """Begin this term's jobs; the term's token is ``term.token``."""

    def stop(self, timeout_s: float) -> bool:
        """End the current term's jobs; False if one in flight outlived ``timeout_s``."""


class ZooKeeperFactory(Protocol):
    """Builds a new, unstarted kazoo ``KazooClient`` (or a fake with the same calls); given
    ``client_id`` (session id, password), one that continues that session when started, if
    the servers still hold it (else kazoo gets a fresh one)."""

    def __call__(self, client_id: tuple[int, bytes] | None = None) -> Any: ...

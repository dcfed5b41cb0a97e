"""What the store answers the node: small frozen values, free of any driver.

:class:`~allocator.postgres.store.NodeDatabase` builds them from rows (column names match
the fields); the node's seams, the fakes and the operators' reports use them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from allocator.fence import Token

CommitCheck = Callable[[], bool]
"""Asked right before COMMIT of a fenced write; False rolls the write back (leadership doubt)."""


@dataclass(frozen=True, slots=True)
class Takeover:
    """What a successful ``take_fence`` found: the persisted mark and the token it replaced."""

    high_water_id: int
    """The last ID ever cut (inclusive); -1 before the first cut."""
    previous_generation: int
    previous_epoch: int


@dataclass(frozen=True, slots=True)
class CutResult:
    """The state after a committed ``cut_blocks`` batch."""

    high_water_id: int
    """The new high-water mark: the batch's last ID."""
    last_ticket: int
    """The claim ticket of the batch's last block."""
    lead_ms: int = 0
    """How far the new mark lies ahead of the database clock (0 when not ahead)."""


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """One row of ``allocator.pool_status``."""

    available_blocks: int
    available_ids: int
    claim_rate_blocks_per_s: float | None
    """None until a pool sample at least 1 s old exists."""
    runway_s: float | None
    """Available blocks / claim rate; None while the rate is unknown or zero."""
    high_water_id: int
    cut_position: int
    claim_position: int
    epoch: int
    holder: str | None
    generation: int = 0
    mark_ahead_ms: int | None = None
    """The mark's millisecond minus the database clock now (> 0: the mark is in the future);
    None before the layout is recorded."""
    mark_lead_ms: int | None = None
    """The mark's lead over the database clock at the cut that set it: the allowance the next
    cut may keep (``cut_blocks``' clock rule)."""
    claims_paused: bool = False
    """An operator paused claims (migration 0010): ``claim_blocks`` answers AL004."""


@dataclass(frozen=True, slots=True)
class TermRecord:
    """One row of ``allocator.leader_history``: a leader's term, from takeover to its end."""

    epoch: int
    holder: str
    host: str | None
    pid: int | None
    elected_at: datetime
    ended_at: datetime | None
    end_reason: str | None
    generation: int = 0


@dataclass(frozen=True, slots=True)
class Rebase:
    """What ``allocator.rebase_fence`` did (the operator's ``allocator fence rebase``)."""

    old_generation: int
    old_epoch: int
    new_generation: int


@dataclass(frozen=True, slots=True)
class FenceState:
    """Who holds the fence: token (0, 0) and no holder before the first takeover."""

    epoch: int
    holder: str | None
    generation: int = 0
    high_water_id: int = -1
    """The last ID ever cut (read with the fence, in one statement)."""

    @property
    def token(self) -> Token:
        """The fence's ``(generation, epoch)`` as a token."""
        return Token(self.generation, self.epoch)


@dataclass(frozen=True, slots=True)
class ClockReading:
    """The database clock against the node's, from one round trip."""

    offset_ms: float
    """Database clock minus the node's clock at the middle of the round trip."""
    uncertainty_ms: float
    """Half the round trip: the true offset lies within ``offset_ms`` ± this."""
    db_ms: int

    def disagrees(self, bound_ms: int) -> bool:
        """True if the clocks differ by more than ``bound_ms`` even at the best reading."""
        return abs(self.offset_ms) - self.uncertainty_ms > bound_ms


SYNCHRONOUS_COMMIT_LEVELS = frozenset({"on", "remote_apply"})
"""``synchronous_commit`` values whose commit waits for a synchronous standby's flush."""


@dataclass(frozen=True, slots=True)
class Replication:
    """How the database replicates, from ``allocator.replication_status()`` (migration 0005)."""

    standbys: int
    """Standbys streaming now plus physical slots nobody streams from."""
    synchronous_standbys: int
    """Streaming standbys a commit waits for (``sync`` or ``quorum``)."""
    synchronous_standby_names: str
    synchronous_commit: str
    """This node's session setting."""
    in_recovery: bool

    @property
    def asynchronous(self) -> bool:
        """True if there are standbys and a commit (of this node) waits for none of them: a
        failover to one may lose acknowledged claims and move the mark back."""
        if self.standbys == 0:
            return False
        return (
            self.synchronous_standbys == 0
            or self.synchronous_commit not in SYNCHRONOUS_COMMIT_LEVELS
        )

    def describe(self) -> str:
        """One line for people: standbys and whether commits wait for them."""
        return (
            f"standbys={self.standbys} synchronous_standbys={self.synchronous_standbys} "
            f"synchronous_standby_names={self.synchronous_standby_names!r} "
            f"synchronous_commit={self.synchronous_commit}"
        )


@dataclass(frozen=True, slots=True)
class BlockAgeBound:
    """The bound on an ID's age, as the leader's heartbeat gives it to the database
    (``allocator.leader_heartbeat``, migration 0011)."""

    max_block_age_ms: int
    serve_aged_without_leader: bool
    """While no leader serves: True keeps handing out aged blocks, False refuses them."""
    leader_stale_ms: int
    """How old the heartbeat may be while the leader still counts as serving."""


@dataclass(frozen=True, slots=True)
class BlockAgeStatus:
    """The one row of ``allocator.block_age_status`` (migration 0011): the bound on an ID's
    age as the last heartbeat wrote it, whether a leader serves, and the pool's oldest block.
    """

    max_block_age_ms: int | None
    """The bound in force; None before a leader of this release wrote a heartbeat."""
    serve_aged_without_leader: bool | None
    heartbeat_at: datetime | None
    leader_serves: bool
    """The heartbeat is no older than its ``leader_stale_ms`` (the database's definition)."""
    oldest_unclaimed_age_ms: int | None
    """How far the oldest unclaimed block's first ID lies behind the database clock; None
    when the pool is empty."""

    def to_json(self) -> dict[str, object]:
        """The ``block_age`` object of ``status --json`` and ``/cluster`` (seconds)."""
        return {
            "max_block_age_s": _seconds(self.max_block_age_ms),
            "oldest_unclaimed_age_s": _seconds(self.oldest_unclaimed_age_ms),
            "leader_serves": self.leader_serves,
            "serve_aged_without_leader": self.serve_aged_without_leader,
            "heartbeat_at": None if self.heartbeat_at is None else self.heartbeat_at.isoformat(),
        }


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


@dataclass(frozen=True, slots=True)
class ClaimedBlock:
    """One block handed out (``allocator.claimed_block_ages``, migration 0011)."""

    ticket: int
    first_id: int
    claimed_at_ms: int
    """When it was claimed, Unix milliseconds by the database clock."""

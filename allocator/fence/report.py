"""The fence as operators see it: the database's token and mark beside what ZooKeeper
holds (its generation, newest zxid and watermark), and the audit of re-bases."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from allocator import fence

REBASE_HISTORY_LIMIT = 5
"""Re-bases shown by ``allocator status`` and ``allocator fence status``."""


@dataclass(frozen=True, slots=True)
class RebaseRecord:
    """One row of ``allocator.fence_history``: who re-based the fence, when and why."""

    rebase_id: int
    rebased_at: datetime
    rebased_by: str
    old_generation: int
    old_epoch: int
    new_generation: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        """The record's ``--json`` object."""
        return {
            "rebase_id": self.rebase_id,
            "rebased_at": self.rebased_at.isoformat(),
            "rebased_by": self.rebased_by,
            "old_generation": self.old_generation,
            "old_epoch": self.old_epoch,
            "new_generation": self.new_generation,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class ZooKeeperFence:
    """What ZooKeeper says about the fence: the generation and the newest zxid it issued."""

    generation: int | None
    """The generation znode's number (0 when absent); None when it holds something else."""
    newest_zxid: int
    """The election path's pzxid after a sync (0 when the path is absent)."""
    generation_znode: str
    """The generation znode's full path, chroot included (for people, not for calls)."""
    problem: str | None = None
    watermark: fence.Watermark | None = None
    """ZooKeeper's copy of the database's token and mark (None: absent or unreadable)."""
    watermark_problem: str | None = None


@dataclass(frozen=True)
class FenceReport:
    """The fence in the database next to what ZooKeeper can have issued."""

    generation: int
    epoch: int
    holder: str | None
    zookeeper: ZooKeeperFence
    rebases: list[RebaseRecord] | None = None
    """The latest re-bases, newest first; None when not read (or not readable by the role)."""
    high_water_id: int = -1
    """The database's high-water mark, read with the fence."""

    @property
    def token(self) -> fence.Token:
        """The database's fence as a :class:`~allocator.fence.Token`."""
        return fence.Token(self.generation, self.epoch)

    @property
    def ahead_of_zookeeper(self) -> bool | None:
        """True: no node can take the fence until an operator re-bases it; None: unknown."""
        zk = self.zookeeper
        if zk.generation is None:
            return None
        return fence.ahead_of_zookeeper(self.token, zk.generation, zk.newest_zxid)

    @property
    def database_behind(self) -> str | None:
        """Why the database is below ZooKeeper's watermark (restored), or None."""
        return fence.database_behind(self.token, self.high_water_id, self.zookeeper.watermark)

    def to_json(self) -> dict[str, Any]:
        """The report's ``fence --json`` object."""
        return {
            "generation": self.generation,
            "epoch": self.epoch,
            "holder": self.holder,
            "zookeeper_generation": self.zookeeper.generation,
            "zookeeper_newest_zxid": self.zookeeper.newest_zxid,
            "generation_znode": self.zookeeper.generation_znode,
            "ahead_of_zookeeper": self.ahead_of_zookeeper,
            "problem": self.zookeeper.problem,
            "rebases": None if self.rebases is None else [r.to_json() for r in self.rebases],
            "high_water_id": self.high_water_id,
            "watermark": self.zookeeper.watermark.to_json() if self.zookeeper.watermark else None,
            "watermark_problem": self.zookeeper.watermark_problem,
            "database_behind_zookeeper": self.database_behind,
        }

"""The fencing token and what it is compared with: one home for the fence's rules.

Rules (DESIGN §3, §11):

- A :class:`Token` is ``(generation, epoch)``. ``epoch`` is the czxid of the leader's own
  election znode (all 64 bits); ``generation`` is the number an operator's
  ``allocator fence rebase`` last wrote into ZooKeeper (the data of :func:`generation_path`,
  0 while that znode does not exist). A node reads both from its own ZooKeeper session and
  passes both to PostgreSQL; SQL never fills in either half. Tokens order as pairs.
- PostgreSQL moves the fence forward only (``take_fence``: the new token must be greater)
  and every fenced write must carry the fence's token exactly (``lock_fence``: equality).
- The fence is *ahead of ZooKeeper* when the database holds a token that ZooKeeper can
  never have issued: a greater generation than the one ZooKeeper records, or, in the same
  generation, an epoch greater than every zxid the ensemble has used under the election
  path (its ``pzxid`` after a ``sync``; every czxid of a child is at most the parent's
  pzxid, and zxids never go backwards in a healthy ensemble). That happens only when the
  ensemble was wiped or restored from an older snapshot; no takeover can succeed until an
  operator re-bases the fence. Nodes report it and wait; they do not churn.
"""

from __future__ import annotations

import posixpath
from typing import NamedTuple

GENERATION_ZNODE = "fence-generation"
"""Name of the znode beside the election path whose data is the fence generation."""


class Token(NamedTuple):
    """A fencing token; compares as the pair ``(generation, epoch)``."""

    generation: int
    epoch: int

    def __str__(self) -> str:
        return f"{self.generation}:{self.epoch:#x}"


def generation_path(election_path: str) -> str:
    """The znode holding the fence generation: a sibling of the election path."""
    parent = posixpath.dirname(election_path.rstrip("/") or "/")
    return posixpath.join(parent, GENERATION_ZNODE)


def parse_generation(data: bytes | None) -> int:
    """The generation stored in the generation znode's data; 0 for no znode.

    Raises ``ValueError`` for data that is not a non-negative decimal integer: a node must
    not guess a generation (it would fence itself out, or worse, in).
    """
    if data is None:
        return 0
    text = data.decode("ascii", "replace").strip()
    if not text.isdigit() or len(text) > 19:
        raise ValueError(f"the fence generation znode holds {data[:40]!r}, not a number")
    return int(text)


def ahead_of_zookeeper(fence: Token, zk_generation: int, zk_pzxid: int) -> bool:
    """True if the database's fence holds a token this ZooKeeper ensemble cannot have issued."""
    if fence.generation != zk_generation:
        return fence.generation > zk_generation
    return fence.epoch > zk_pzxid

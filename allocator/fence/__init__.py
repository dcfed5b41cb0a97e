"""The fencing token and what it is compared with: one home for the fence's rules.

The protocol (takeover forward only, every write on the exact token, the re-base after a
ZooKeeper rebuild) is docs/design.md §3; the watermark and a database that went backwards,
§11. Every number read from ZooKeeper must fit PostgreSQL's ``bigint`` (:data:`BIGINT_MAX`):
one that does not is unparsable, so one bad write can neither block every node for good nor
overflow a reset's arithmetic.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import NamedTuple

GENERATION_ZNODE = "fence-generation"
"""Name of the znode beside the election path whose data is the fence generation."""
WATERMARK_ZNODE = "db-watermark"
"""Name of the znode beside the election path holding the :class:`Watermark`."""
WATERMARK_INTERVAL_S = 1.0
"""A leader raises the watermark at most this often (and at every term change): how far it
may lag the cuts (a restore's reset adds it, :mod:`allocator.pool.restore_mark`)."""
BLOCKED_RETRY_S = 5.0
"""A node that cannot take the fence (the fence ahead of ZooKeeper, the database behind the
watermark, an unreadable generation) tries again this often: an operator's repair takes
effect within it (``allocator.node.Pacing.blocked_retry_s``)."""
BIGINT_MAX = 2**63 - 1
"""The largest value of PostgreSQL's ``bigint``: the bound of every number read here."""
_DECIMAL = re.compile(r"[0-9]+")


class Token(NamedTuple):
    """A fencing token; compares as the pair ``(generation, epoch)``.

    ``epoch`` is the czxid of the leader's own election znode (all 64 bits); ``generation``
    is the number ``allocator fence rebase`` last wrote into ZooKeeper
    (:func:`generation_path`, 0 while that znode does not exist). A node reads both from its
    own session and passes both to PostgreSQL; SQL never fills in either half. PostgreSQL
    moves the fence forward only (``take_fence``: the new token must be greater) and every
    fenced write must carry it exactly (``lock_fence``: equality).
    """

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

    Raises ``ValueError`` for data that is not a decimal integer in ``0..BIGINT_MAX``: a
    node must not guess a generation (it would fence itself out, or worse, in).
    """
    if data is None:
        return 0
    text = data.decode("ascii", "replace").strip()
    if not _DECIMAL.fullmatch(text):
        raise ValueError(f"the fence generation znode holds {data[:40]!r}, not a number")
    digits = text.lstrip("0") or "0"
    if len(digits) > 19 or int(digits) > BIGINT_MAX:
        raise ValueError(
            f"the fence generation znode holds {data[:40]!r}, past the largest generation "
            f"({BIGINT_MAX})"
        )
    return int(digits)


def ahead_of_zookeeper(fence: Token, zk_generation: int, zk_pzxid: int) -> bool:
    """True if the database's fence holds a token this ZooKeeper ensemble cannot have
    issued.

    That is a greater generation than ZooKeeper records, or, in the same generation, an
    epoch greater than every zxid the ensemble used under the election path (``zk_pzxid``,
    read after a ``sync``: a child's czxid is at most its parent's pzxid, and zxids never go
    backwards in a healthy ensemble). It happens only when the ensemble was wiped or
    restored from an older snapshot; no takeover can succeed until an operator re-bases the
    fence, and nodes report it and wait rather than churn.
    """
    if fence.generation != zk_generation:
        return fence.generation > zk_generation
    return fence.epoch > zk_pzxid


def watermark_path(election_path: str) -> str:
    """The znode holding the :class:`Watermark`: a sibling of the election path."""
    parent = posixpath.dirname(election_path.rstrip("/") or "/")
    return posixpath.join(parent, WATERMARK_ZNODE)


@dataclass(frozen=True)
class Watermark:
    """ZooKeeper's copy of what the database is known to hold: the newest token that took
    the fence and the newest high-water mark a leader cut.

    Each leader raises it right after its takeover and after its cuts (at most every
    :data:`WATERMARK_INTERVAL_S`) and never lowers it (:meth:`merge`, a read-modify-write on
    the znode's version). It lags the database, so in a healthy cluster the database is
    never below it; when it is (:func:`database_behind`) nodes neither take the fence nor
    cut. A watermark that does not parse is reported and ignored: it cannot make a node
    refuse to lead.
    """

    token: Token
    high_water_id: int

    def merge(self, other: Watermark) -> Watermark:
        """The larger of each part: the watermark never goes down."""
        return Watermark(max(self.token, other.token), max(self.high_water_id, other.high_water_id))

    def to_bytes(self) -> bytes:
        """The znode's data: a JSON object of the three numbers."""
        return json.dumps(
            {
                "generation": self.token.generation,
                "epoch": self.token.epoch,
                "high_water_id": self.high_water_id,
            },
            sort_keys=True,
        ).encode()

    def to_json(self) -> dict[str, int]:
        """The watermark's ``--json`` object."""
        return {
            "generation": self.token.generation,
            "epoch": self.token.epoch,
            "high_water_id": self.high_water_id,
        }

    @classmethod
    def from_bytes(cls, data: bytes) -> Watermark:
        """Parse the znode's data; ``ValueError`` for anything but our JSON object."""
        try:
            raw = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # ValueError: also a number too long
            raise ValueError(f"the watermark znode holds {data[:60]!r}, not JSON") from exc
        if not isinstance(raw, dict):
            raise ValueError(f"the watermark znode holds {data[:60]!r}, not a JSON object")
        values = [raw.get(key) for key in ("generation", "epoch", "high_water_id")]
        if not all(type(v) is int for v in values):
            raise ValueError(f"the watermark znode holds {data[:60]!r}: integers expected")
        generation, epoch, high_water_id = (int(v) for v in values)  # type: ignore[arg-type]
        in_range = (
            0 <= generation <= BIGINT_MAX,
            0 <= epoch <= BIGINT_MAX,
            -1 <= high_water_id <= BIGINT_MAX,
        )
        if not all(in_range):
            raise ValueError(f"the watermark znode holds {data[:60]!r}: out of range")
        return cls(Token(generation, epoch), high_water_id)


def database_behind(db_token: Token, db_high_water_id: int, copy: Watermark | None) -> str | None:
    """Why the database is below ZooKeeper's watermark, or None when it is not.

    Below means its fence or its mark is: the database went backwards (restored from a
    backup, or failed over to a standby that missed commits), and nodes then neither take
    the fence nor cut, and wait for an operator.
    """
    if copy is None:
        return None
    reasons = []
    if db_token < copy.token:
        reasons.append(f"its fence {db_token} is older than the watermark's {copy.token}")
    if db_high_water_id < copy.high_water_id:
        reasons.append(
            f"its high-water mark {db_high_water_id} is below the watermark's {copy.high_water_id}"
        )
    return "; ".join(reasons) or None

"""Why a leader's term ends, and what each reason asks of the node: one table.

The reasons are the strings the database records (``leader_terms.end_reason``), logs and
``/status`` show.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class TermEnd(StrEnum):
    """Why a term ends: the strings the database records (``leader_terms.end_reason``), logs
    and ``/status`` show.
    """

    SHUTDOWN = "shutdown"
    STEPPED_DOWN = "stepped_down"
    CLOCK_SKEW = "clock_skew"
    DB_UNREACHABLE = "db_unreachable"
    SESSION_LOST = "session_lost"
    ZNODE_LOST = "znode_lost"
    FENCED = "fenced"
    FATAL = "fatal"


@dataclass(frozen=True)
class EndRule:
    """What one reason asks of the node, in the order :meth:`Leading._end` does it."""

    leave_first: bool
    """Delete our znode before anything else: every database call (the jobs in flight, the
    end of the term) would first wait out a dead path's timeouts."""
    record_end: bool
    """Record the end in the database (otherwise the successor's takeover ends the term as
    ``superseded``, or nobody can: the fence has moved on)."""
    leave: bool
    """Delete our znode once the term is over: the next contender takes over at once."""
    exits: bool
    """The node stops: exit 4 when fenced, else the fatal error's own code."""
    role_after: str


RULES: dict[TermEnd, EndRule] = {
    # the node was asked to stop: hand over at once, record why, exit 0
    TermEnd.SHUTDOWN: EndRule(False, True, True, False, "stopping"),
    # `allocator step-down`: hand over, then queue again at the back
    TermEnd.STEPPED_DOWN: EndRule(False, True, True, False, "follower"),
    # the clock disagrees and a fit contender queues
    TermEnd.CLOCK_SKEW: EndRule(False, True, True, False, "follower"),
    # no write for leader.db_unreachable_s and a fit contender queues
    TermEnd.DB_UNREACHABLE: EndRule(True, False, False, False, "follower"),
    # the session ended: the run loop exits 3 or rejoins with a new session
    TermEnd.SESSION_LOST: EndRule(False, False, False, False, "follower"),
    # our znode is gone or not ours: record it, join again
    TermEnd.ZNODE_LOST: EndRule(False, True, False, False, "follower"),
    # a newer token holds the fence: nothing of ours may be written any more
    TermEnd.FENCED: EndRule(False, False, False, True, "follower"),
    # the jobs met an error no retry can help (a layout mismatch): exit with its code
    TermEnd.FATAL: EndRule(False, True, True, True, "stopping"),
}
"""Every term end flushes the cuts the watermark's rate limit held back, whatever the
reason (best effort, bounded): it costs one ZooKeeper call and covers a restore's reset."""

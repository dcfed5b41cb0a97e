"""How often the node's loops look again, and how long they back off: one value per pause.

The defaults are the product's; tests pass shorter ones (a constructor argument, never a
patched module constant).
"""

from __future__ import annotations

from dataclasses import dataclass

from allocator import fence


@dataclass(frozen=True)
class Pacing:
    """Every pause of the node's loops, in seconds."""

    recheck_s: float = 0.5
    """A follower re-reads its predecessor, a leader re-checks its znode and the session."""
    handover_check_s: float = 1.0
    """A leader asks whether it should hand over (reads the contenders' adverts)."""
    stale_takeover_backoff_s: float = 2.0
    """After a takeover lost a race, or after making way: before joining again."""
    blocked_retry_s: float = fence.BLOCKED_RETRY_S
    """A blocked node tries the takeover again (an operator may have repaired the cause)."""
    zookeeper_error_backoff_s: float = 1.0
    rejoin_attempt_s: float = 2.0
    """After a session loss, one attempt to get a session back waits at most this long (and
    ``zookeeper.connect_timeout_s``) before a fresh client tries again: a fresh client tries
    at once, where one client's back-off grows to ``zookeeper.max_reconnect_delay_s``."""
    job_stop_timeout_s: float = 10.0
    """The longest a term's end waits for the leader's job in flight."""
    election_scan_s: float = 5.0
    """The whole election is read to report znodes that are ignored or do not parse."""

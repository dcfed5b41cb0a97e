"""The mark a reset after a restore moves to: each candidate, and which one wins (issue 19).

The restored database may hand out nothing that was handed out before (:class:`MarkPlan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from allocator.fence import WATERMARK_INTERVAL_S

WATERMARK_LAG_MS = round(WATERMARK_INTERVAL_S * 1000)
"""How far ZooKeeper's watermark may lag the cuts: the leaders' rate limit on raising it."""

CANDIDATES = ("restored_database", "watermark", "old_database", "restored_clock")


@dataclass(frozen=True)
class MarkPlan:
    """The candidates for the reset's mark; the mark is the largest of them.

    With claims paused on the old database and the claims in flight ended, every ID it
    handed out was cut before the pause, so lies at or below its mark read after the pause;
    what it cuts later is never handed out. The candidates:

    - ``restored_database``: the restored database's own mark (a mark never moves back);
    - ``watermark``: ZooKeeper's watermark read after the pause. It lags the cuts by up to
      :data:`WATERMARK_LAG_MS` and, before issue 19, missed a fenced leader's last cuts;
    - ``old_database``: the old database's mark read after the pause, when it can be read;
      with it the bound holds whatever the two servers' clocks say;
    - ``restored_clock``: the restored server's clock plus ``pool.max_clock_ahead_ms`` (no
      cut lies further ahead of its database's clock, AL105) plus :data:`WATERMARK_LAG_MS`.
      Without the old database's mark this covers the cuts the watermark missed: safe while
      the restored server's clock is not behind the old one's (at its last cut) by more than
      that extra lag, and the old mark carried no lead beyond ``pool.max_clock_ahead_ms``
      (``pool_status.mark_lead_ms``; a reset leaves one).

    ``reset_after_restore`` takes the watermark and the old mark as its floor
    (:attr:`floor`; it keeps its own mark) and computes the clock candidate itself, at its
    own moment, from :attr:`lead_ms`; the plan's clock candidate is read before the reset,
    so the reset's is a little larger.
    """

    restored_database: int
    watermark: int | None
    """None: no watermark (absent or unreadable)."""
    old_database: int | None
    """None: the old database was not read (``--old-database-unreachable``)."""
    restored_clock: int | None
    """None: the restored database recorded no layout yet (no ID was ever cut there)."""
    max_clock_ahead_ms: int

    @property
    def lead_ms(self) -> int:
        """What the reset adds to the restored server's clock."""
        return self.max_clock_ahead_ms + WATERMARK_LAG_MS

    @property
    def floor(self) -> int:
        """``reset_after_restore``'s ``p_min_high_water_id``."""
        known = [v for v in (self.watermark, self.old_database) if v is not None]
        return max([-1, *known])

    def values(self) -> dict[str, int | None]:
        """Each candidate by name, None where it is not known."""
        return {
            "restored_database": self.restored_database,
            "watermark": self.watermark,
            "old_database": self.old_database,
            "restored_clock": self.restored_clock,
        }

    def winner(self, new_mark: int | None = None) -> str:
        """The candidate that sets the mark: the largest (ties: the first listed); after the
        reset, ``new_mark`` (what it set) decides, the clock having moved on meanwhile."""
        known = {name: value for name, value in self.values().items() if value is not None}
        if new_mark is not None and new_mark > max(known.values()):
            return "restored_clock"
        best = max(known.values())
        return next(name for name in CANDIDATES if known.get(name) == best)

    def to_json(self, new_mark: int | None = None) -> dict[str, Any]:
        """The candidates and the winner, for ``--json``."""
        return {
            "candidates": self.values(),
            "winner": self.winner(new_mark),
            "floor": self.floor,
            "lead_ms": self.lead_ms,
            "max_clock_ahead_ms": self.max_clock_ahead_ms,
            "watermark_lag_ms": WATERMARK_LAG_MS,
        }

    def lines(self, new_mark: int | None = None) -> list[str]:
        """One line per candidate, the winner marked."""
        winner = self.winner(new_mark)
        labels = {
            "restored_database": "the restored database's own mark",
            "watermark": "ZooKeeper's watermark (read after the pause)",
            "old_database": "the old database's mark (read after the pause)",
            "restored_clock": (
                f"the restored server's clock + {self.lead_ms} ms ({self.max_clock_ahead_ms} "
                f"max_clock_ahead + {WATERMARK_LAG_MS} lag)"
            ),
        }
        missing = {
            "watermark": "none",
            "old_database": "not read (--old-database-unreachable)",
            "restored_clock": "none (no layout recorded)",
        }
        lines = []
        for name in CANDIDATES:
            value = self.values()[name]
            shown = missing[name] if value is None else str(value)
            if name == "restored_clock" and value is not None and new_mark is None:
                shown += " (now; the reset computes it again)"
            mark = "  <- the mark" if name == winner else ""
            lines.append(f"  {labels[name]:<72} {shown}{mark}")
        return lines

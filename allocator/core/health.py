"""What a node knows about its own fitness to lead: database reachability and its clock.

Thread-safe (the probe thread, the jobs and the leader loop all touch it); times are
monotonic seconds from the clock given at construction. The hand-over rules: docs/design.md
§11.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

CLOCK_SKEW = "clock_skew"
DB_UNREACHABLE = "db_unreachable"


@dataclass(frozen=True)
class Advert:
    """What a contender publishes about itself in its election znode; None means "not known
    yet".
    """

    db_ok: bool | None
    clock_ok: bool | None

    @property
    def fit(self) -> bool:
        """True if the contender reaches the database and its clock agrees: worth handing
        over to.

        Handing over is only worth it to a fit contender; without one the leader keeps
        leading, so a database down for everyone, or a database clock wrong for everyone,
        never makes leadership churn.
        """
        return bool(self.db_ok and self.clock_ok)


class NodeHealth:
    """The probe's and the leader's writes' verdicts on this node, and whether to hand over."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._db_ok: bool | None = None
        self._clock_ok: bool | None = None
        self._clock_bad_since: float | None = None
        self._term_started: float | None = None
        self._last_write_ok: float | None = None
        self.offset_ms: float | None = None
        self.async_replication: bool | None = None
        """Whether the database, at the leader's last refill, had standbys no commit waits
        for (None: not checked yet). The same for every node: never a reason to hand over."""

    # -- the probe ---------------------------------------------------------------------

    def probed(self, offset_ms: float | None, clock_ok: bool | None) -> None:
        """One probe's result: ``offset_ms`` None when the database did not answer.

        Every node probes every ``leader.probe_interval_s`` (one round trip reading the
        database clock, bounded by the connection's keepalives and ``tcp_user_timeout``):
        whether it reached the database and whether its clock agrees within
        ``pool.max_clock_skew_ms``.
        """
        with self._lock:
            self._db_ok = offset_ms is not None
            self.offset_ms = offset_ms
            if clock_ok is not None:
                self._set_clock_ok(clock_ok)

    def clock_checked(self, ok: bool) -> None:
        """A clock comparison made elsewhere (the refill, a rejected cut)."""
        with self._lock:
            self._set_clock_ok(ok)

    def replication_checked(self, asynchronous: bool) -> None:
        """The refill's verdict on the database's replication."""
        with self._lock:
            self.async_replication = asynchronous

    def _set_clock_ok(self, ok: bool) -> None:
        self._clock_ok = ok
        if ok:
            self._clock_bad_since = None
        elif self._clock_bad_since is None:
            self._clock_bad_since = self._clock()

    def clock_disagreeing_for_s(self) -> float | None:
        """How long the clock has disagreed without a break; None while it agrees."""
        with self._lock:
            since = self._clock_bad_since
            return None if since is None else self._clock() - since

    def advert(self) -> Advert:
        """Both verdicts, as the node advertises them in its election znode."""
        with self._lock:
            return Advert(db_ok=self._db_ok, clock_ok=self._clock_ok)

    # -- the leader's writes -------------------------------------------------------------

    def term_started(self) -> None:
        """A term began: the unreachable-database clock counts from now, not an older
        success.
        """
        with self._lock:
            self._term_started = self._clock()
            self._last_write_ok = None

    def term_ended(self) -> None:
        """The term is over: no write outcomes are judged until the next one."""
        with self._lock:
            self._term_started = None
            self._last_write_ok = None

    def write_succeeded(self) -> None:
        """One of the leader's fenced writes committed."""
        with self._lock:
            self._last_write_ok = self._clock()

    # -- the verdict ---------------------------------------------------------------------

    def handover_reason(self, clock_skew_handover_s: float, db_unreachable_s: float) -> str | None:
        """Why this leader should hand over now, or None.

        :data:`CLOCK_SKEW` once its clock has disagreed for ``clock_skew_handover_s``
        without a break; :data:`DB_UNREACHABLE` once no write has succeeded for
        ``db_unreachable_s``, counted from the start of the term when none has (a term that
        never writes is not judged by an older success). Whether a fit contender exists is
        the caller's question (:class:`Advert`).
        """
        with self._lock:
            now = self._clock()
            if self._clock_bad_since is not None and now - self._clock_bad_since >= (
                clock_skew_handover_s
            ):
                return CLOCK_SKEW
            if self._term_started is not None:
                since = self._term_started
                if self._last_write_ok is not None:
                    since = self._last_write_ok
                if now - since >= db_unreachable_s:
                    return DB_UNREACHABLE
            return None

"""Pausing claims: what ``allocator pool pause`` and ``pool resume`` do (migration 0010)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from allocator.core.errors import AllocatorError
from allocator.core.exits import Exit
from allocator.postgres import operator as db

POLL_S = 0.05
"""How often the claims in flight are listed while waiting for them."""
DEFAULT_TIMEOUT_S = 70.0
"""Longer than ``claim_blocks``' 60 s idle bound: a claim left idle in its transaction has
been ended by the server before the pause gives up on it."""


class ClaimsStillOpenError(AllocatorError):
    """Claims are paused, but claims begun before the pause were still open at the timeout."""

    exit_code = Exit.TEMPFAIL  # they end by themselves, or an operator ends them

    def __init__(self, message: str, *, pause: db.Pause, still_open: list[db.ClaimInFlight]):
        super().__init__(message)
        self.pause = pause
        self.still_open = still_open


@dataclass(frozen=True)
class Paused:
    """A pause in force with no claim begun before it still open."""

    pause: db.Pause
    waited_for: list[db.ClaimInFlight]
    """The claims that were in flight when the pause committed (all ended since)."""
    waited_s: float


def pause(
    url: str,
    reason: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    connect_timeout_s: float = db.STATUS_CONNECT_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Paused:
    """Pause claims and wait for the claims in flight.

    The pause is committed first (``allocator.pause_claims``, audited), then waited for: the
    sessions that held a claim in their open transaction right after that commit
    (``allocator.claims_in_flight()``, by virtual transaction) are polled every
    :data:`POLL_S` (one ``pg_locks`` read) until none is left. A claim whose transaction
    took ``claim_blocks``' lock after that listing sees the pause (migration 0010 argues
    why), so once the listed ones are gone no claim begun before the pause is open, and none
    after it succeeds. The wait holds no lock: claims arriving meanwhile get AL004 at once.

    Past ``timeout_s`` the pause stays in force and :class:`ClaimsStillOpenError` names each
    session still holding a claim: one idle in its transaction ends within ``claim_blocks``'
    60 s idle bound, one still running statements only when it commits, rolls back or is
    terminated. Running it again waits again (pausing paused claims changes nothing else).
    """
    with db.operator_session(url, connect_timeout_s=connect_timeout_s) as session:
        paused = session.pause_claims(reason)
        started = clock()
        in_flight = session.claims_in_flight()
        listed = {claim.virtualtransaction for claim in in_flight}
        open_now = in_flight
        while open_now:
            if clock() - started >= timeout_s:
                raise ClaimsStillOpenError(
                    still_open_message(paused, open_now, timeout_s),
                    pause=paused,
                    still_open=open_now,
                )
            sleep(POLL_S)
            open_now = [c for c in session.claims_in_flight() if c.virtualtransaction in listed]
        return Paused(paused, in_flight, clock() - started)


def still_open_message(paused: db.Pause, still_open: list[db.ClaimInFlight], waited: float) -> str:
    """The error line naming each session that still holds a claim begun before the pause."""
    sessions = "; ".join(claim.describe() for claim in still_open)
    return (
        f"claims are paused (pause {paused.pause_id}), but {len(still_open)} claim(s) begun "
        f"before the pause were still open after {waited:g} s: {sessions}. A claim idle in "
        "its transaction ends within 60 s (claim_blocks' bound); end one now with SELECT "
        "pg_terminate_backend(pid) (its claim rolls back). Run `allocator pool pause` again "
        "to wait again"
    )


def resume(
    url: str, reason: str, *, connect_timeout_s: float = db.STATUS_CONNECT_TIMEOUT_S
) -> db.Resume:
    """Resume claims: one audited call; resuming claims that are not paused changes nothing."""
    with db.operator_session(url, connect_timeout_s=connect_timeout_s) as session:
        return session.resume_claims(reason)

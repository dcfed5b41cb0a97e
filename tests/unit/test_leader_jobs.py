"""The leader's jobs on APScheduler: a refill stuck in an old term never blocks a later term.

Rules: no servers. A fake database whose requeue hangs for the first term's token (as a
call on a black-holed connection would until tcp_user_timeout); the second term's refill
must run all the same (job ids carry the token, so APScheduler's max_instances=1 applies
per term). The hung call is released at the end so no thread outlives the test.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from allocator.config import load_config
from allocator.core.health import NodeHealth
from allocator.core.leadership import SessionGuard, Term
from allocator.core.records import BlockAgeStatus, ClaimedBlock, ClockReading, PoolStatus
from allocator.fence import Token
from allocator.metrics import NodeMetrics
from allocator.node.seams import LeaderHooks
from jobs.leader import LeaderJobs

OLD, NEW = Token(0, 10), Token(0, 20)
DEADLINE_S = 10.0


class HangingDatabase:
    """Enough of NodeDatabase for a refill run; the OLD token's requeue hangs."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.requeued: list[Token] = []
        self.hanging = threading.Event()

    def pool_status(self) -> PoolStatus:
        return PoolStatus(1_000_000, 1_000_000 * 4096, None, None, -1, 0, 0, 0, None)

    def requeue_stranded(self, token: Token, commit_if: Any = None) -> int:
        if token == OLD:
            self.hanging.set()
            self.release.wait(DEADLINE_S)
        self.requeued.append(token)
        return 0

    def read_clock(self, now_ms: Any) -> ClockReading:
        return ClockReading(offset_ms=0.0, uncertainty_ms=0.1, db_ms=int(now_ms()))

    def record_pool_sample(self) -> None:
        pass

    def prune_claimed(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def leader_heartbeat(self, *args: Any, **kwargs: Any) -> None:
        pass

    def void_aged_blocks(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def block_age_status(self) -> BlockAgeStatus:
        return BlockAgeStatus(None, None, None, False, None)

    def claimed_block_ages(self, *args: Any) -> list[ClaimedBlock]:
        return []


def term(token: Token) -> Term:
    guard = SessionGuard(10.0)
    guard("CONNECTED")  # type: ignore[arg-type]
    started = Term(token, guard)
    started.activate()
    return started


def hooks() -> LeaderHooks:
    return LeaderHooks(health=NodeHealth(), on_fenced=lambda exc: None, on_fatal=lambda exc: None)


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_refill_stuck_in_an_old_term_never_blocks_the_next_terms_refill() -> None:
    config = load_config(None, {"pool.refill_interval_s": 0.05}, env={})
    db = HangingDatabase()
    jobs = LeaderJobs(db, config, NodeMetrics())  # type: ignore[arg-type]
    jobs.start_scheduler()
    try:
        old = term(OLD)
        jobs.start(old, hooks())
        wait_until(db.hanging.is_set, "the old term's refill to hang")
        old.end("db_unreachable")
        assert not jobs.stop(0.1)  # the hung run outlives the wait: reported, not waited for
        jobs.start(term(NEW), hooks())
        wait_until(lambda: NEW in db.requeued, "the new term's refill to run")
        assert OLD not in db.requeued
    finally:
        db.release.set()
        jobs.stop(DEADLINE_S)
        jobs.shutdown()

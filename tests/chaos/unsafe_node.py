"""TEST ONLY: a deliberately broken node, the proof that the invariant checker catches a dual
master.

Run as ``python -m tests.chaos.unsafe_node`` with the same ``ALLOCATOR_*`` environment as
``allocator run``. It is a real node wired by the product's composition root
(:func:`allocator.commands.run.build_node`) with two collaborators replaced through the
node's seams, never through a switch in the product (docs/design.md §11):

- :class:`UnsafeTerm`: ``may_write`` ignores the session and the end of its term;
- :class:`UnsafeLeaderJobs`: when the term ends, one more refill runs before the jobs stop,
  as a paused leader that resumes writes before it notices its session is gone (without
  it the resumed node's scheduled refill races the session-loss exit, and the proof
  sometimes found nothing to catch);
- :class:`UnsafeNodeDatabase`: blocks are written by a plain INSERT (superuser URL needed),
  bypassing ``cut_blocks``' fence, mark, layout and clock checks; fenced maintenance
  writes that fail (requeue, prune, the heartbeat, the aging void) are ignored. With
  ``--ignore-clock`` it also reports that the node's clock agrees with the database's
  whatever it says (run it under libfaketime to move the mark ahead: the checker's clock
  rule must catch it);
- with ``--linger-s S``, :class:`LingeringLeaderJobs`: when the term ends (a step-down, say)
  the node goes on cutting with its old token for S more seconds, once its successor has
  written with the new one. ``allocator drill --scenario step-down`` on a
  cluster of such nodes (``allocator local up --node-command``) must then fail.

Every one of these needs the superuser URL (``ALLOCATOR_POSTGRES_URL``) for its plain INSERT.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from allocator.commands.run import build_node, load, serve
from allocator.core import cutter, logs
from allocator.core.errors import AllocatorError, DatabaseError, FencedError
from allocator.core.leadership import Term
from allocator.core.records import BlockAgeBound, ClockReading, CommitCheck, CutResult
from allocator.fence import Token
from allocator.postgres.store import NodeDatabase
from jobs import refill
from jobs.context import LeaderContext
from jobs.leader import LeaderJobs

log = logs.get_logger("tests.chaos.unsafe_node")

_POSITIONS = (
    "SELECT h.last_ticket, (SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END"
    " FROM allocator.claim_ticket s) FROM allocator.high_water h FOR UPDATE"
)
_INSERT = (
    "INSERT INTO allocator.blocks (ticket, first_id, last_id, generation, epoch)"
    " SELECT %(first_ticket)s + u.o - 1, u.f, u.l, %(generation)s, %(epoch)s"
    " FROM unnest(%(first_ids)s::bigint[], %(last_ids)s::bigint[]) WITH ORDINALITY AS u(f, l, o)"
)
_ADVANCE = (
    "UPDATE allocator.high_water SET last_id = greatest(last_id, %(last_id)s),"
    " last_ticket = greatest(last_ticket, %(last_ticket)s), updated_at = statement_timestamp()"
)


class UnsafeTerm(Term):
    """May always write, whatever the session says and after the term ended."""

    def may_write(self) -> bool:
        return True


class UnsafeLeaderJobs(LeaderJobs):
    """Writes once more after the term ended (an :class:`UnsafeTerm` always may)."""

    def stop(self, timeout_s: float) -> bool:
        ctx = self._ctx
        if ctx is not None:
            log.warning("unsafe_last_refill", epoch=ctx.term.epoch, note="TEST NODE")
            try:
                refill.run(ctx)
            except AllocatorError as exc:
                # The test waits for a write after the term, from this run or from the
                # scheduled refill that woke with the node; this one may fail (a connection
                # the server dropped while the node was paused). A failure must not turn the
                # node's exit code into a crash (CI #29: exit 1 instead of 3, after a write).
                log.warning("unsafe_last_refill_failed", error=str(exc), note="TEST NODE")
        return super().stop(timeout_s)


class LingeringLeaderJobs(LeaderJobs):
    """When the term ends, the jobs stop as usual, but for ``linger_s`` seconds more the node
    cuts one block with the old token every ``LINGER_CUT_EVERY_S``, from the successor's
    first write on (:func:`_cut_while_lingering`).

    The forced cuts make the dual master certain: a stale refill writes only when the pool is
    below its target. The scheduled jobs used to linger too, and an ex-leader whose refill
    ran just before its successor's kept the pool full each time, so the successor wrote
    nothing for the whole linger and a drill on a busy machine had nothing to catch.
    """

    linger_s = 0.0

    def stop(self, timeout_s: float) -> bool:
        ctx = self._ctx
        stopped = super().stop(timeout_s)
        if ctx is not None:
            log.warning("unsafe_jobs_linger", seconds=self.linger_s, note="TEST NODE")
            threading.Thread(
                target=_cut_while_lingering, args=(ctx, self.linger_s), daemon=True
            ).start()
        return stopped


LINGER_CUT_EVERY_S = 0.2
SUCCESSOR_POLL_S = 0.01
"""How often a lingering node looks for its successor's first write: its first stale cut
must follow at once, since a drill's rounds take a few tens of milliseconds and it judges
the ledger right after the last one."""


def _cut_while_lingering(ctx: LeaderContext, linger_s: float) -> None:
    """One block after the database's mark, with the ended term's token, every
    ``LINGER_CUT_EVERY_S`` for ``linger_s`` seconds (whatever the pool level or the clock),
    from the successor's first write on.

    Not before it: the checker judges I3 by the tokens' order along the IDs, and a stale
    block cut after the takeover but before the successor's first write sits where the old
    token's blocks still belong (its documented blind spot, which the real fence forbids).
    CI once saw a successor write nothing for a whole linger (a full pool), and a broken
    fence pass the drill. After a newer token's block, every stale block is out of order."""
    config = ctx.config
    db = ctx.db
    if not isinstance(db, UnsafeNodeDatabase):
        raise TypeError("a lingering node needs the unsafe store")
    deadline = time.monotonic() + linger_s
    while time.monotonic() < deadline:
        try:
            if db.newest_block_token() <= ctx.term.token:
                time.sleep(SUCCESSOR_POLL_S)
                continue  # the successor has not written yet
            mark = db.pool_status().high_water_id
            plan = cutter.plan_blocks(
                config.layout,
                config.cluster.datacenter_id,
                config.layout_section.block_size,
                mark,
                ctx.now_ms(),
                1,
                config.pool.max_clock_behind_ms,
            )
            if plan.blocks:
                db.cut_blocks(ctx.term.token, list(plan.blocks))
        except Exception as exc:  # a test node: log and keep trying
            log.warning("unsafe_linger_cut_failed", error=str(exc), note="TEST NODE")
        time.sleep(LINGER_CUT_EVERY_S)


class UnsafeNodeDatabase(NodeDatabase):
    """Block writes by plain INSERT, with no fence and no high-water check."""

    ignore_clock = False

    def read_clock(self, now_ms: Callable[[], float]) -> ClockReading:
        reading = super().read_clock(now_ms)
        if self.ignore_clock:  # lie: "the clocks agree"
            return ClockReading(offset_ms=0.0, uncertainty_ms=0.0, db_ms=reading.db_ms)
        return reading

    def cut_blocks(
        self,
        token: Token,
        ranges: Sequence[tuple[int, int]],
        commit_if: CommitCheck | None = None,
    ) -> CutResult:
        what = "cut blocks (UNSAFE: unfenced test node)"
        log.warning(
            "unsafe_unfenced_write",
            token=str(token),
            blocks=len(ranges),
            first_id=ranges[0][0] if ranges else None,
            note="TEST NODE",
        )
        with self._connection(what) as conn, conn.transaction():
            row = conn.execute(_POSITIONS).fetchone()
            if row is None:
                raise DatabaseError(f"{what}: the database returned no row")
            first_ticket = max(int(row[0]), int(row[1])) + 1
            conn.execute(
                _INSERT,
                {
                    "first_ticket": first_ticket,
                    "generation": token.generation,
                    "epoch": token.epoch,
                    "first_ids": [first for first, _ in ranges],
                    "last_ids": [last for _, last in ranges],
                },
            )
            last_ticket = first_ticket + len(ranges) - 1
            conn.execute(_ADVANCE, {"last_id": ranges[-1][1], "last_ticket": last_ticket})
        return CutResult(high_water_id=ranges[-1][1], last_ticket=last_ticket)

    def newest_block_token(self) -> Token:
        """The token of the block with the highest first ID ((0, 0) for none)."""
        with self._connection("read the newest block's token") as conn:
            row = conn.execute(
                "SELECT generation, epoch FROM allocator.blocks ORDER BY first_id DESC LIMIT 1"
            ).fetchone()
        return Token(0, 0) if row is None else Token(int(row[0]), int(row[1]))

    def requeue_stranded(self, token: Token, commit_if: CommitCheck | None = None) -> int:
        try:
            return super().requeue_stranded(token, commit_if)
        except FencedError:
            return 0  # a stale unsafe leader carries on regardless

    def prune_claimed(
        self,
        token: Token,
        retention_s: float,
        limit: int,
        commit_if: CommitCheck | None = None,
    ) -> int:
        try:
            return super().prune_claimed(token, retention_s, limit, commit_if)
        except FencedError:
            return 0

    def leader_heartbeat(
        self,
        token: Token,
        bound: BlockAgeBound,
        commit_if: CommitCheck | None = None,
    ) -> datetime:
        try:
            return super().leader_heartbeat(token, bound, commit_if)
        except FencedError:  # the refill writes it first: a stale one must not stop the cut
            return datetime.now(UTC)

    def void_aged_blocks(
        self,
        token: Token,
        ahead_ms: int,
        limit: int,
        commit_if: CommitCheck | None = None,
    ) -> int:
        try:
            return super().void_aged_blocks(token, ahead_ms, limit, commit_if)
        except FencedError:
            return 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.unsafe_node")
    parser.add_argument("--ignore-clock", action="store_true")
    parser.add_argument("--linger-s", type=float, default=None)
    args = parser.parse_args()
    config = load(None, None, None, None, None, ())
    logs.configure(config.node.log_format)
    log.warning("test_node_started", note="UNSAFE, unfenced; tests/chaos only")
    store = UnsafeNodeDatabase(
        config.postgres,
        node_name=config.node.resolved_name(),
        layout=config.layout,
        datacenter_id=config.cluster.datacenter_id,
        max_clock_ahead_ms=config.pool.max_clock_ahead_ms,
    )
    store.ignore_clock = args.ignore_clock
    jobs: type[LeaderJobs] = UnsafeLeaderJobs
    if args.linger_s is not None:
        LingeringLeaderJobs.linger_s = args.linger_s
        jobs = LingeringLeaderJobs
    serve(build_node(config, store=store, term_factory=UnsafeTerm, jobs_factory=jobs))


if __name__ == "__main__":
    main()

"""The pool reset after a restore (``allocator pool reset --after-restore``) as a procedure;
the command parses options, asks and prints.

The operator's way out of a database that went backwards (restored from a backup, or failed
over to a standby that missed commits); the procedure around it is docs/postgres-ha.md
(pause the old database, reset, swap, resume). Pausing claims is
:mod:`allocator.pool.pause`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from allocator import fence
from allocator.config import Config
from allocator.core import redact
from allocator.core.errors import AllocatorError, DatabaseUnavailableError, UsageError
from allocator.core.records import PoolStatus
from allocator.core.zookeeper_hosts import chroot_of
from allocator.fence.znodes import read_zookeeper_fence, write_generation
from allocator.pool import restore_mark
from allocator.postgres import operator as db
from allocator.zookeeper import client as zkclient
from allocator.zookeeper.calls import close, start, wait, zookeeper_client, zookeeper_errors


@dataclass(frozen=True)
class OldDatabase:
    """What the old database said after its pause."""

    high_water_id: int
    pause: db.OpenPause


@dataclass(frozen=True)
class Outcome:
    """What the reset did: the plan, the new mark and generation, and whether ZooKeeper was
    updated.
    """

    reset: db.Reset
    plan: restore_mark.MarkPlan
    watermark: fence.Watermark | None
    watermark_problem: str | None
    old_database: OldDatabase | None
    generation_znode: str
    zookeeper_written: bool

    def to_json(self) -> dict[str, Any]:
        """The ``pool reset --json`` object."""
        r = self.reset
        old = self.old_database
        return {
            "voided_blocks": r.voided_blocks,
            "old_high_water_id": r.old_high_water_id,
            "new_high_water_id": r.new_high_water_id,
            "old_generation": r.old_generation,
            "old_epoch": r.old_epoch,
            "new_generation": r.new_generation,
            "mark": self.plan.to_json(r.new_high_water_id),
            "watermark": self.watermark.to_json() if self.watermark else None,
            "watermark_problem": self.watermark_problem,
            "old_database": None
            if old is None
            else {
                "high_water_id": old.high_water_id,
                "paused_at": old.pause.paused_at.isoformat(),
                "paused_by": old.pause.paused_by,
                "pause_reason": old.pause.reason,
            },
            "claims_paused": True,
            "generation_znode": self.generation_znode,
            "zookeeper_written": self.zookeeper_written,
        }


def _database_of(url: str) -> tuple[str, str, str]:
    """(host, port, dbname) as libpq would resolve the URL's own parts ('' when absent)."""
    try:
        parts = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise UsageError(f"not a PostgreSQL URL: {redact.redact(url)}") from exc
    return tuple(str(parts.get(key) or "") for key in ("host", "port", "dbname"))  # type: ignore[return-value]


def check_old_database(url: str, old_url: str | None, old_unreachable: bool) -> None:
    """Step 1's usage rules: exactly one of ``--old-database-url`` and
    ``--old-database-unreachable``, and not the database reset (exit 64).

    Which bound protects the IDs is the operator's explicit choice, never a default.
    """
    if old_url and old_unreachable:
        raise UsageError("give --old-database-url or --old-database-unreachable, not both")
    if not old_url and not old_unreachable:
        raise UsageError(
            "pool reset needs --old-database-url URL (the database that served until the "
            "restore, its claims paused with `allocator pool pause`) or, when it cannot be "
            "read any more, --old-database-unreachable (docs/postgres-ha.md says what bound "
            "then holds)"
        )
    if old_url and _database_of(old_url) == _database_of(url):
        raise UsageError(
            "--old-database-url names the database being reset; give the database that "
            "served consumers until the restore"
        )


def read_old_database(old_url: str, config: Config) -> OldDatabase:
    """Step 1: the old database's claims are paused and no claim begun before the pause is
    open (else exit 1, nothing changed); its mark, read after the pause, is a candidate.

    Unreachable: exit 75, nothing changed; an operator who knows it is gone says
    ``--old-database-unreachable`` instead, and the mark then rests on the watermark and the
    restored server's clock (:mod:`allocator.pool.restore_mark`).
    """
    try:
        with db.operator_session(
            old_url, connect_timeout_s=config.postgres.connect_timeout_s
        ) as session:
            pause = session.open_pause()
            if pause is None:
                raise AllocatorError(
                    "claims are not paused on the old database: its mark is final only once "
                    "nothing more is handed out there. Run `allocator pool pause --reason "
                    "TEXT --database-url <old database>` first; nothing changed"
                )
            older = [
                c
                for c in session.claims_in_flight()
                if c.xact_start is not None and c.xact_start < pause.paused_at
            ]
            if older:
                raise AllocatorError(
                    "claims begun before the old database's pause are still open: "
                    + "; ".join(c.describe() for c in older)
                    + ". Run `allocator pool pause` on it again to wait for them; nothing changed"
                )
            mark = session.pool_status().high_water_id
    except DatabaseUnavailableError as exc:
        raise DatabaseUnavailableError(
            f"cannot read the old database ({exc}). If it is gone for good, run the reset with "
            "--old-database-unreachable instead of --old-database-url: the mark then rests on "
            "ZooKeeper's watermark and this server's clock (docs/postgres-ha.md); nothing changed"
        ) from exc
    return OldDatabase(mark, pause)


def reset(
    config: Config,
    url: str,
    reason: str,
    *,
    old_url: str | None,
    confirm: Callable[[list[str]], bool] | None = None,
) -> Outcome:
    """Reset the restored database: the steps, in this order.

    1. The old database (:func:`read_old_database`).
    2. ZooKeeper's watermark (the config's servers, without the chroot), read after the pause.
    3. The restored database's fence, mark, layout and clock: the plan, each candidate and the
       winner, printed (stderr) before ``confirm`` is asked with the plan's lines (False:
       cancelled, nothing changed; None: confirmed already, ``--yes``; neither ``--yes`` nor
       ``--reason`` comes from the environment) and in ``--json``.
    4. ``allocator.reset_after_restore`` (migrations 0006, 0010; operator role, audited in
       ``allocator.pool_resets``): void every unclaimed block, move the mark past the floor and
       past the restored server's clock + ``pool.max_clock_ahead_ms`` + the watermark's lag,
       advance the fence generation, and leave claims paused (the procedure's last step
       resumes them).
    5. Write the new generation into ZooKeeper's generation znode (never lowering it, as
       ``fence rebase`` does), so nodes take the fence under it. If this fails the database is
       reset (recorded) and ZooKeeper's generation lags: nodes see the fence ahead of ZooKeeper
       and wait; ``allocator fence rebase`` (or this command again) completes it.
    """
    old = read_old_database(old_url, config) if old_url else None
    client = zookeeper_client(config, chroot=False)
    start(client, config)
    try:
        chroot = chroot_of(config.zookeeper.hosts)
        election_path = chroot + config.zookeeper.election_path
        with zookeeper_errors(config, "read the watermark"):
            zk_fence = read_zookeeper_fence(client, election_path, config)
        watermark, problem = zk_fence.watermark, zk_fence.watermark_problem
        with db.operator_session(url, connect_timeout_s=config.postgres.connect_timeout_s) as s:
            pool, layout_clock = s.pool_status(), s.layout_clock()
        max_ahead = config.pool.max_clock_ahead_ms
        plan = restore_mark.MarkPlan(
            restored_database=pool.high_water_id,
            watermark=watermark.high_water_id if watermark else None,
            old_database=old.high_water_id if old else None,
            restored_clock=None
            if layout_clock is None
            else layout_clock.id_at(layout_clock.db_ms + max_ahead + restore_mark.WATERMARK_LAG_MS),
            max_clock_ahead_ms=max_ahead,
        )
        if confirm is not None and not confirm(plan_lines(pool, watermark, problem, plan)):
            raise AllocatorError("cancelled; nothing changed")
        result = db.reset_after_restore(
            url,
            reason,
            plan.floor,
            plan.lead_ms,
            connect_timeout_s=config.postgres.connect_timeout_s,
        )
        znode = fence.generation_path(election_path)
        acl = zkclient.acl(config)
        try:
            with zookeeper_errors(config, f"write the generation into {znode}"):
                # The chroot's parents keep the open ACL (others may share them): only the
                # chroot and what lies below it get ours.
                zkclient.ensure_chroot(client, chroot, acl, lambda p: wait(p, config))
                wait(client.ensure_path_async(election_path, acl=acl), config)
                written = write_generation(client, znode, result.new_generation, acl, config)
        except AllocatorError as exc:
            raise type(exc)(
                f"the pool is reset in the database (generation {result.new_generation}, "
                "recorded in allocator.pool_resets), but ZooKeeper's generation was not "
                "updated; run `allocator fence rebase` to complete it"
            ) from exc
    finally:
        close(client)
    return Outcome(result, plan, watermark, problem, old, znode, written.written)


def plan_lines(
    pool: PoolStatus,
    watermark: fence.Watermark | None,
    problem: str | None,
    plan: restore_mark.MarkPlan,
) -> list[str]:
    """The plan for people: the restored database, the watermark and each mark candidate."""
    shown = f"{watermark.token}, mark {watermark.high_water_id}" if watermark else problem or "-"
    return [
        f"database   mark {pool.high_water_id}, fence {fence.Token(pool.generation, pool.epoch)}",
        f"watermark  {shown}",
        "mark: the largest of",
        *plan.lines(),
        "reset: void every unclaimed block, move the mark there, advance the fence "
        "generation, leave claims paused (resume them after the swap)",
    ]


def outcome_lines(outcome: Outcome) -> list[str]:
    """The outcome for people, one fact a line."""
    r = outcome.reset
    return [
        f"pool reset: {r.voided_blocks} unclaimed blocks voided (claimed by "
        "'allocator:voided-by-reset')",
        f"mark       {r.old_high_water_id} -> {r.new_high_water_id}, the largest of",
        *outcome.plan.lines(r.new_high_water_id),
        f"fence      {fence.Token(r.old_generation, r.old_epoch)} -> generation "
        f"{r.new_generation}, epoch 0 (recorded in allocator.pool_resets and fence_history)",
        f"zookeeper  generation {r.new_generation} in {outcome.generation_znode}"
        + ("" if outcome.zookeeper_written else " (already there)"),
        "claims     paused on this database (AL004) until `allocator pool resume`: swap it "
        "in, let a leader cut a fresh pool, then resume",
    ]

"""The fence re-based (``allocator fence rebase``) as a procedure; the command parses
options, asks and prints.

After a ZooKeeper ensemble is wiped or restored from an older snapshot every takeover is
refused (AL101) and nodes report the fence ahead of ZooKeeper; :func:`rebase` advances the
fence generation in the database (audited) and then in ZooKeeper (docs/design.md §3, §11).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient

from allocator import fence
from allocator.config import Config
from allocator.core import redact
from allocator.core.errors import AllocatorError, ConfigError
from allocator.core.zookeeper_hosts import split_hosts
from allocator.fence.report import FenceReport, RebaseRecord
from allocator.fence.znodes import (
    Written,
    ensure_paths,
    read_watermark,
    read_zookeeper_fence,
    write_generation,
)
from allocator.postgres import operator as db
from allocator.postgres.operator import read_rebases
from allocator.zookeeper import client as zkclient
from allocator.zookeeper.calls import close, start, wait, zookeeper_client, zookeeper_errors


@dataclass(frozen=True)
class Plan:
    """What the command found before changing anything."""

    fence: FenceReport
    hosts: str
    chroot: str
    election_path: str
    """The election path as the client addresses it: chroot included."""
    database: str
    """The database URL, password masked."""

    @property
    def watermark_znode(self) -> str:
        """The watermark's full path, chroot included."""
        return fence.watermark_path(self.election_path)


class DatabaseWentBackError(ConfigError):
    """The database is below ZooKeeper's watermark: it needs ``pool reset --after-restore``,
    not a re-base (exit 78, EX_CONFIG: retrying cannot help, an operator must act first)."""


@dataclass(frozen=True)
class Outcome:
    """What the command did."""

    old: fence.Token
    new_generation: int
    reason: str
    generation_znode: str
    zookeeper_hosts: str
    zookeeper: Written
    created: list[str]
    was_ahead_of_zookeeper: bool | None
    record: RebaseRecord | None
    watermark: fence.Watermark | None
    """ZooKeeper's watermark as the plan read it (None: absent or unreadable)."""
    watermark_problem: str | None
    watermark_znode: str

    def to_json(self) -> dict[str, Any]:
        """The ``fence rebase --json`` object (``watermark``, ``watermark_problem`` and
        ``watermark_znode`` included).
        """
        record = self.record
        return {
            "old_generation": self.old.generation,
            "old_epoch": self.old.epoch,
            "new_generation": self.new_generation,
            "reason": self.reason,
            "generation_znode": self.generation_znode,
            "zookeeper_hosts": self.zookeeper_hosts,
            "zookeeper_previous_generation": self.zookeeper.previous,
            "zookeeper_znode_existed": self.zookeeper.existed,
            "zookeeper_written": self.zookeeper.written,
            "created_znodes": self.created,
            "was_ahead_of_zookeeper": self.was_ahead_of_zookeeper,
            "rebase_id": record.rebase_id if record else None,
            "rebased_by": record.rebased_by if record else None,
            "rebased_at": record.rebased_at.isoformat() if record else None,
            "watermark": self.watermark.to_json() if self.watermark else None,
            "watermark_problem": self.watermark_problem,
            "watermark_znode": self.watermark_znode,
        }


def read_plan(client: KazooClient, config: Config, url: str) -> Plan:
    """Step 1: ZooKeeper's watermark, the database's fence and mark, then ZooKeeper's
    generation and zxids. Changes nothing.

    That order matters: the watermark lags the database and the zxids lead it, so a leader
    at work between the reads can make neither verdict wrong. ZooKeeper is reached through
    the config's servers without the chroot; an unreachable ensemble fails the command while
    the fence is still untouched.
    """
    servers, chroot = split_hosts(config.zookeeper.hosts)
    election_path = chroot + config.zookeeper.election_path
    with zookeeper_errors(config, "read the watermark"):
        wait(client.sync_async(election_path), config)
        watermark, watermark_problem = read_watermark(client, election_path, config)
    pool, _terms = db.read_status(
        url, history_limit=1, connect_timeout_s=config.postgres.connect_timeout_s
    )
    with zookeeper_errors(config, "read the fence generation"):
        zk_fence = read_zookeeper_fence(
            client, election_path, config, watermark=(watermark, watermark_problem)
        )
    report = FenceReport(
        pool.generation, pool.epoch, pool.holder, zk_fence, high_water_id=pool.high_water_id
    )
    return Plan(report, servers, chroot, election_path, redact.mask_conninfo(url))


def refuse_database_behind(plan: Plan) -> None:
    """Refuse a database that went back, before anything changes.

    Below ZooKeeper's watermark (a restore, a failover that lost commits) its pool may hand
    out blocks already claimed, which a re-base does not repair:
    :class:`DatabaseWentBackError` (exit 78, naming ``allocator pool reset
    --after-restore``), checked before the generation. Under ZooKeeper's generation, the
    database, not the ensemble, was restored, and a re-base would move ZooKeeper back:
    refused too (the database's generation is the one that counts; this command never lowers
    ZooKeeper's). An absent watermark (a wiped ensemble, the usual case) or one that does
    not parse (shown in the plan, then ignored) refuses nothing.
    """
    report = plan.fence
    reason = report.database_behind
    copy = report.zookeeper.watermark
    if reason is not None and copy is not None:
        raise DatabaseWentBackError(
            f"the database went backwards ({reason}): it holds fence {report.token}, mark "
            f"{report.high_water_id}; ZooKeeper's watermark {plan.watermark_znode} holds fence "
            f"{copy.token}, mark {copy.high_water_id}. Restored from a backup or failed over "
            "to a standby that missed commits, it needs `allocator pool reset "
            "--after-restore`, not a re-base (which repairs no pool); nothing changed"
        )
    zk_generation = plan.fence.zookeeper.generation
    if zk_generation is not None and zk_generation > plan.fence.generation:
        raise AllocatorError(
            f"ZooKeeper holds fence generation {zk_generation}, the database only "
            f"{plan.fence.generation}: the database was restored, not the ensemble, and a "
            "re-base would move ZooKeeper's generation back; nothing changed"
        )


def watermark_line(
    znode: str, watermark: fence.Watermark | None, problem: str | None, behind: str | None
) -> str:
    """The watermark for people: its parts and the verdict, or why there is none."""
    if watermark is not None:
        verdict = (
            f"the database is BELOW it ({behind})" if behind else "the database is not below it"
        )
        return (
            f"watermark  {znode}: fence {watermark.token}, mark {watermark.high_water_id}: "
            f"{verdict}"
        )
    if problem:
        return f"watermark  {znode}: unreadable, ignored ({problem})"
    return f"watermark  {znode}: none (as after a wipe; nothing to compare the database with)"


def describe_plan(plan: Plan) -> list[str]:
    """The plan as the confirmation prompt shows it, lines for people (the watermark the
    verdict used included).
    """
    report = plan.fence
    zk = report.zookeeper
    ahead = {True: "AHEAD of ZooKeeper", False: "not ahead of ZooKeeper", None: "unknown"}
    zk_generation = "unreadable" if zk.generation is None else str(zk.generation)
    lines = [
        f"database   {plan.database}",
        f"  fence    {report.token} held by {report.holder or 'nobody'}, mark "
        f"{report.high_water_id}: {ahead[report.ahead_of_zookeeper]}",
        f"zookeeper  {plan.hosts}",
        f"  {zk.generation_znode}: generation {zk_generation}; newest zxid "
        f"{zk.newest_zxid:#x} under {plan.election_path}",
    ]
    if zk.problem:
        lines.append(f"  ({zk.problem}; it will be overwritten)")
    lines += [
        watermark_line(
            plan.watermark_znode, zk.watermark, zk.watermark_problem, report.database_behind
        ),
        f"re-base to generation {report.generation + 1} (epoch 0): the current term ends "
        "('rebased'), a leader still writing is fenced out (exit 4), and the first node in "
        "the election takes the fence under the new generation.",
    ]
    if report.ahead_of_zookeeper is False and not zk.problem:
        lines.append(
            "note: the fence is not ahead of ZooKeeper; this re-base only forces a handover"
        )
    return lines


def rebase(
    config: Config, url: str, reason: str, confirm: Callable[[Plan], bool] | None = None
) -> Outcome:
    """Re-base the fence: the four steps, in this order.

    1. :func:`read_plan`, then :func:`refuse_database_behind`.
    2. Ask ``confirm`` with the plan (False: cancelled, nothing changed; None: confirmed
       already, ``--yes``); after an answer, step 1 runs again (an answer may take long).
       Then recreate the chroot and the election path if missing (a wiped ensemble has
       neither, and the generation znode needs its parent).
    3. Re-base in the database (``allocator.rebase_fence``: audited, epoch reset to 0, the
       open term ended as 'rebased'; the reason checked again, AL106 →
       :class:`~allocator.core.errors.InvalidRequestError`). The database goes first: if the
       ZooKeeper write then fails, the fence is ahead of ZooKeeper exactly as before and
       running again advances once more, harmlessly; the reverse order would let nodes take
       the fence under a generation no audit record explains.
    4. Write the new generation into the generation znode (create, or a versioned set that
       never lowers it: of two operators racing, the higher generation stays), with the
       cluster's digest ACL.
    """
    client = zookeeper_client(config, chroot=False)
    start(client, config)
    try:
        plan = read_plan(client, config, url)
        refuse_database_behind(plan)
        if confirm is not None:
            if not confirm(plan):
                raise AllocatorError("cancelled; nothing changed")
            plan = read_plan(client, config, url)  # an answer may take long: compare again
            refuse_database_behind(plan)
        acl = zkclient.acl(config)
        created = ensure_paths(client, plan.chroot, plan.election_path, acl, config)
        result = db.rebase_fence(url, reason, connect_timeout_s=config.postgres.connect_timeout_s)
        znode = fence.generation_path(plan.election_path)
        try:
            with zookeeper_errors(config, f"write the generation into {znode}"):
                written = write_generation(client, znode, result.new_generation, acl, config)
        except AllocatorError as exc:
            # Same class (same exit code), a message that says what is done and what is not.
            raise type(exc)(
                f"the database's fence is re-based to generation {result.new_generation} "
                "(recorded), but ZooKeeper was not updated; run the same command again: it "
                "advances once more and writes the generation"
            ) from exc
    finally:
        close(client)
    record = _latest_record(config, url, result.new_generation)
    return Outcome(
        old=fence.Token(result.old_generation, result.old_epoch),
        new_generation=result.new_generation,
        reason=reason,
        generation_znode=znode,
        zookeeper_hosts=plan.hosts,
        zookeeper=written,
        created=created,
        was_ahead_of_zookeeper=plan.fence.ahead_of_zookeeper,
        record=record,
        watermark=plan.fence.zookeeper.watermark,
        watermark_problem=plan.fence.zookeeper.watermark_problem,
        watermark_znode=plan.watermark_znode,
    )


def _latest_record(config: Config, url: str, generation: int) -> RebaseRecord | None:
    """The audit row just written (for "by whom"); None when it cannot be read: the re-base
    itself is done, so a failure here is no reason to fail the command."""
    try:
        records = read_rebases(url, 1, connect_timeout_s=config.postgres.connect_timeout_s)
    except AllocatorError:
        return None
    return next((r for r in records or [] if r.new_generation == generation), None)


def outcome_lines(outcome: Outcome) -> list[str]:
    """The outcome for people, one fact a line."""
    record = outcome.record
    who = (
        f" as #{record.rebase_id} by {record.rebased_by} at {record.rebased_at:%Y-%m-%d %H:%M:%S%z}"
        if record
        else ""
    )
    lines = [
        f"fence re-based: {outcome.old} -> generation {outcome.new_generation}, epoch 0",
        f"database   recorded in allocator.fence_history{who}",
    ]
    lines += [f"zookeeper  created {path}" for path in outcome.created]

    before = outcome.zookeeper.previous
    if not outcome.zookeeper.existed:
        was = "created"
    else:
        was = "held no number" if before is None else f"was {before}"
    if outcome.zookeeper.written:
        lines.append(
            f"zookeeper  wrote {outcome.new_generation} to {outcome.generation_znode} on "
            f"{outcome.zookeeper_hosts} ({was})"
        )
    else:
        lines.append(
            f"zookeeper  {outcome.generation_znode} already holds generation {before} "
            f"(a concurrent re-base); left as it is"
        )
    lines.append(
        watermark_line(outcome.watermark_znode, outcome.watermark, outcome.watermark_problem, None)
    )
    lines.append(
        "nodes take the fence under the new generation at their next attempt (within "
        f"{fence.BLOCKED_RETRY_S:g} s); check with `allocator fence status`"
    )
    return lines

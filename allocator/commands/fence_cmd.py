"""``allocator fence rebase`` and ``allocator fence status``: the operator's side of the fence.

After a ZooKeeper ensemble is wiped or restored from an older snapshot, its new czxids lie
below the fence PostgreSQL holds, every takeover is refused (AL101) and the nodes report
the fence *ahead of ZooKeeper* (:mod:`allocator.fence`). ``fence rebase`` ends that: it
advances the fence generation in the database (``allocator.rebase_fence``: audited, epoch
reset to 0, the open term ended as 'rebased') and writes the new generation into the
generation znode beside the election path, where every node reads it from its own session.

Rules:

- Steps, in this order:

  1. Connect to ZooKeeper (the config's servers, without the chroot), then read, before
     anything changes: ZooKeeper's watermark, the fence and mark in the database, and
     ZooKeeper's generation and newest zxid; an unreachable ensemble fails the command
     while the fence is still untouched. That order: the watermark lags the database and
     the zxids lead it (:func:`allocator.status.read_watermark`, :mod:`allocator.status`),
     so a leader at work between the reads can make neither verdict below wrong. Refuse a
     database that went back (below).
  2. Show the plan and get the confirmation (below); then recreate the chroot and the
     election path if they are missing (``ensure_path``; a wiped ensemble has neither,
     and the generation znode needs its parent).
  3. Re-base in the database. The database goes first: if the ZooKeeper write then
     fails, the fence is ahead of ZooKeeper exactly as before (nodes keep reporting it,
     nothing is cut) and running the command again advances once more, harmlessly. The
     reverse order would let nodes take the fence under a generation no audit record
     explains, and a failed database step would leave ZooKeeper ahead of the fence.
  4. Write the new generation into the generation znode (create, or a versioned set that
     never lowers it: of two operators racing, the higher generation stays).

- The database's generation is the one that counts; this command never lowers ZooKeeper's.
  When ZooKeeper already holds a higher generation than the database, the *database* was
  restored, not the ensemble: the command refuses (a re-base would move ZooKeeper back).
- A database whose fence or mark is below ZooKeeper's watermark (:mod:`allocator.fence`)
  went backwards (a restore, a failover that lost commits): its pool may hand out blocks
  already claimed, which a re-base does not repair. The command refuses it (exit 78, the
  way out named: ``allocator pool reset --after-restore``), before the generation check.
  An absent watermark (a wiped ensemble: the usual case for a re-base) refuses nothing,
  nor does one that does not parse (shown in the plan and the output, then ignored). The
  plan shows the watermark the verdict used, and so does the outcome (``--json`` adds
  ``watermark``, ``watermark_problem`` and ``watermark_znode``).
- Confirmation: ``--yes``, or an answer on a terminal after the plan (step 1's findings)
  is shown; without a terminal and without ``--yes`` the command refuses before it
  connects to anything. Neither ``--yes`` nor
  ``--reason`` can come from an ``ALLOCATOR_*`` variable (STYLE: a person types each
  time; the reason is the audit record's why, so a stale one must not linger in an
  environment).
- The reason is checked here (1..1000 characters, not only blanks) and again by the SQL
  function (AL106 → :class:`~allocator.errors.InvalidRequestError`).
- The database URL is ``--database-url`` (``ALLOCATOR_FENCE_REBASE_DATABASE_URL``) or
  ``--database-url-file``, else ``postgres.url``: a login role granted
  ``allocator_operator``, which the audit records. A URL with a password is refused on the
  command line (:mod:`allocator.commands.options`).
  ZooKeeper comes from ``zookeeper.hosts`` (chroot included), ``zookeeper.auth`` (znodes
  created here carry the cluster's digest ACL) and ``zookeeper.election_path``.
- Output: what happened, for people; ``--json`` for machines. Errors: one line, no
  traceback, the error's exit code (2 refused or bad reason, 75 a server unavailable, 78
  a database below the watermark).
"""

from __future__ import annotations

import json
import posixpath
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import click
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.security import ACL

from allocator import config as config_mod
from allocator import db, fence, status, zkclient
from allocator.commands import options
from allocator.commands.options import CONFIG, OTHER, UNAVAILABLE, USAGE, config_options, exit_codes
from allocator.config import Config
from allocator.errors import AllocatorError, ConfigError, UsageError

MAX_REASON_CHARS = 1000
"""As ``allocator.rebase_fence`` checks it (AL106)."""
WRITE_ATTEMPTS = 10
"""Versioned writes of the generation znode before giving up on a racing writer."""


@dataclass(frozen=True)
class Plan:
    """What the command found before changing anything."""

    fence: status.FenceReport
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
    record: status.RebaseRecord | None
    watermark: fence.Watermark | None
    """ZooKeeper's watermark as the plan read it (None: absent or unreadable)."""
    watermark_problem: str | None
    watermark_znode: str

    def to_json(self) -> dict[str, Any]:
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


def check_reason(reason: str) -> str:
    if not reason.strip():
        raise UsageError("--reason must say why the fence is re-based (it is the audit record)")
    if len(reason) > MAX_REASON_CHARS:
        raise UsageError(
            f"--reason is {len(reason)} characters long; at most {MAX_REASON_CHARS} are kept"
        )
    return reason


def read_plan(client: KazooClient, config: Config, url: str) -> Plan:
    """Step 1: ZooKeeper's watermark, the database's fence and mark, then ZooKeeper's
    generation and zxids (that order: see the module rules). Changes nothing."""
    servers, chroot = status.split_hosts(config.zookeeper.hosts)
    election_path = chroot + config.zookeeper.election_path
    with status.zookeeper_errors(config, "read the watermark"):
        status.wait(client.sync_async(election_path), config)
        watermark, watermark_problem = status.read_watermark(client, election_path, config)
    pool, _terms = db.read_status(
        url, history_limit=1, connect_timeout_s=config.postgres.connect_timeout_s
    )
    with status.zookeeper_errors(config, "read the fence generation"):
        zk_fence = status.read_zookeeper_fence(
            client, election_path, config, watermark=(watermark, watermark_problem)
        )
    report = status.FenceReport(
        pool.generation, pool.epoch, pool.holder, zk_fence, high_water_id=pool.high_water_id
    )
    return Plan(report, servers, chroot, election_path, config_mod.mask_url(url))


def refuse_database_behind(plan: Plan) -> None:
    """Refuses a database that went back: below ZooKeeper's watermark
    (:class:`DatabaseWentBackError`, the way out named), or under ZooKeeper's generation.
    An absent or unreadable watermark refuses nothing."""
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


def check_confirmable(yes: bool) -> None:
    """Refuses at once when nobody could answer the question."""
    if not yes and not sys.stdin.isatty():
        raise UsageError(
            "fence rebase changes the token every node is checked against; "
            "pass --yes to confirm (stdin is not a terminal)"
        )


def confirm(plan: Plan, yes: bool) -> None:
    if yes:
        return
    for line in describe_plan(plan):
        click.echo(line, err=True)
    if not click.confirm("Re-base the fence?", default=False, err=True):
        raise AllocatorError("cancelled; nothing changed")


def ensure_paths(
    client: KazooClient, plan: Plan, acl: list[ACL] | None, config: Config
) -> list[str]:
    """Step 2: the chroot and the election path, created when missing; returns those created.

    Only the chroot and what lies below it carry the cluster's ACL; parents above the
    chroot belong to whoever shares the ensemble."""
    created: list[str] = []
    with status.zookeeper_errors(config, "recreate the election path"):
        if plan.chroot and posixpath.dirname(plan.chroot) != "/":
            status.wait(client.ensure_path_async(posixpath.dirname(plan.chroot)), config)
        for path in filter(None, (plan.chroot, plan.election_path)):
            if status.wait(client.exists_async(path), config) is None:
                status.wait(client.ensure_path_async(path, acl=acl), config)
                created.append(path)
    return created


class Written(NamedTuple):
    """What step 4 found and did."""

    previous: int | None
    """The generation the znode held before; None when absent or not a number."""
    existed: bool
    written: bool


def write_generation(
    client: KazooClient, path: str, generation: int, acl: list[ACL] | None, config: Config
) -> Written:
    """Step 4: ``generation`` into ``path``, never lowering it."""
    data = str(generation).encode()
    for _ in range(WRITE_ATTEMPTS):
        try:
            old, stat = status.wait(client.get_async(path), config)
        except NoNodeError:
            try:
                status.wait(client.create_async(path, data, acl=acl), config)
            except NodeExistsError:
                continue  # another writer: read again
            return Written(None, existed=False, written=True)
        try:
            previous: int | None = fence.parse_generation(old)
        except ValueError:
            previous = None  # garbage: the re-base rewrites it
        if previous is not None and previous >= generation:
            return Written(previous, existed=True, written=False)
        try:
            status.wait(client.set_async(path, data, version=stat.version), config)
        except BadVersionError:
            continue
        return Written(previous, existed=True, written=True)
    raise AllocatorError(f"{path} kept changing under {WRITE_ATTEMPTS} attempts to write it")


def rebase(config: Config, url: str, reason: str, yes: bool) -> Outcome:
    """The four steps of the module docstring."""
    check_confirmable(yes)
    client = status.zookeeper_client(config, chroot=False)
    status.start(client, config)
    try:
        plan = read_plan(client, config, url)
        refuse_database_behind(plan)
        confirm(plan, yes)
        if not yes:  # an answer may take long: compare again with what holds now
            plan = read_plan(client, config, url)
            refuse_database_behind(plan)
        acl = zkclient.acl(config)
        created = ensure_paths(client, plan, acl, config)
        result = db.rebase_fence(url, reason, connect_timeout_s=config.postgres.connect_timeout_s)
        znode = fence.generation_path(plan.election_path)
        try:
            with status.zookeeper_errors(config, f"write the generation into {znode}"):
                written = write_generation(client, znode, result.new_generation, acl, config)
        except AllocatorError as exc:
            # Same class (same exit code), a message that says what is done and what is not.
            raise type(exc)(
                f"the database's fence is re-based to generation {result.new_generation} "
                "(recorded), but ZooKeeper was not updated; run the same command again: it "
                "advances once more and writes the generation"
            ) from exc
    finally:
        status.close(client)
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


def _latest_record(config: Config, url: str, generation: int) -> status.RebaseRecord | None:
    """The audit row just written (for "by whom"); None when it cannot be read: the re-base
    itself is done, so a failure here is no reason to fail the command."""
    try:
        records = status.read_rebases(url, 1, connect_timeout_s=config.postgres.connect_timeout_s)
    except AllocatorError:
        return None
    return next((r for r in records or [] if r.new_generation == generation), None)


def outcome_lines(outcome: Outcome) -> list[str]:
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
    from allocator.node import FENCE_AHEAD_BACKOFF_S

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
        f"{FENCE_AHEAD_BACKOFF_S:g} s); check with `allocator fence status`"
    )
    return lines


@click.group("fence", epilog=exit_codes(*options.GROUP_CODES))
def fence_group() -> None:
    """The fencing token: re-base it after a ZooKeeper rebuild, or show it."""


def audited_options(record: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--reason``, ``--yes``, ``--json``, ``--database-url`` and the config options of an
    audited operator command whose why lands in ``record``; neither ``--reason`` nor
    ``--yes`` comes from the environment (see the module rules)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(
            [
                options.typed_option(
                    "--reason",
                    required=True,
                    help=f"Why (1..1000 characters); recorded with who and when in {record}.",
                ),
                options.typed_option(
                    "--yes",
                    is_flag=True,
                    help="Confirm without a prompt (needed when stdin is not a terminal).",
                ),
                click.option(
                    "--json",
                    "as_json",
                    is_flag=True,
                    show_envvar=True,
                    help="Print one JSON object.",
                ),
                options.database_url_option(
                    help="PostgreSQL URL of a login role granted allocator_operator. "
                    "[default: config postgres.url]"
                ),
                config_options,
            ]
        ):
            command = option(command)
        return command

    return decorate


@fence_group.command(
    "rebase",
    epilog=exit_codes(
        (0, "done (what changed is printed)"),
        (1, "cancelled at the prompt; or the database was restored, not the ensemble"),
        OTHER,
        (2, "no --yes and no terminal to ask on; an empty or too long --reason (AL106)"),
        USAGE,
        UNAVAILABLE,
        CONFIG,
        (
            DatabaseWentBackError.exit_code,
            "the database went backwards (below ZooKeeper's watermark): run `allocator pool "
            "reset --after-restore` instead",
        ),
    ),
)
@audited_options("allocator.fence_history")
def rebase_command(
    reason: str,
    yes: bool,
    as_json: bool,
    database_url: str | None,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> None:
    """Advance the fence generation after a ZooKeeper ensemble was wiped or restored.

    Database first (audited), then the generation znode beside the election path.
    Refuses a database below ZooKeeper's watermark (restored, or failed over with lost
    commits): that one needs `allocator pool reset --after-restore`.
    """
    check_reason(reason)
    flags = {"postgres.url": database_url} if database_url else {}
    config = config_mod.load_from_options(config_path, set_pairs, flags)
    outcome = rebase(config, config.postgres.url.get_secret_value(), reason, yes)
    if as_json:
        click.echo(json.dumps(outcome.to_json(), indent=2))
        return
    for line in outcome_lines(outcome):
        click.echo(line)


@fence_group.command(
    "status",
    epilog=exit_codes(
        (0, "printed (a fence ahead of ZooKeeper is a line of it, not an exit)"),
        USAGE,
        UNAVAILABLE,
        CONFIG,
        OTHER,
    ),
)
@click.option("--json", "as_json", is_flag=True, show_envvar=True, help="Print one JSON object.")
@options.database_url_option(
    help="PostgreSQL URL (operator or node role). [default: config postgres.url]"
)
@config_options
def status_command(
    as_json: bool, database_url: str | None, config_path: Path | None, set_pairs: tuple[str, ...]
) -> None:
    """The database's fence, ZooKeeper's generation and newest zxid, and the last re-bases."""
    from allocator.commands.status import fence_lines

    flags = {"postgres.url": database_url} if database_url else {}
    config = config_mod.load_from_options(config_path, set_pairs, flags)
    report = status.gather_fence(config)
    data = report.to_json()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    for line in fence_lines(data):
        click.echo(line)
    ahead = data["ahead_of_zookeeper"]
    click.echo(f"ahead       {'unknown' if ahead is None else 'YES' if ahead else 'no'}")
    click.echo("re-bases" + ("" if data["rebases"] else "    none"))
    for record in report.rebases or []:
        click.echo(
            f"  #{record.rebase_id} {record.rebased_at:%Y-%m-%d %H:%M:%S%z} by "
            f"{record.rebased_by}: {fence.Token(record.old_generation, record.old_epoch)} -> "
            f"generation {record.new_generation}: {record.reason}"
        )

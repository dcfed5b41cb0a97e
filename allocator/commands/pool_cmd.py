"""``allocator pool``: pause and resume claims, and reset the pool after a restore.

``pool pause`` / ``pool resume`` (operator role; :mod:`allocator.claim_pause`, migration
0010): pause commits the pause (audited in ``allocator.claim_pause_history``), then waits
until every claim that was in flight has ended, at most ``--timeout`` (exit 75 naming the
sessions still holding one; the pause stays in force). No ``--yes``: a pause takes nothing
away that ``resume`` does not give back, and an operator who pauses in an incident wants it
now. ``--reason`` is the audit record's why and never comes from the environment.

``pool reset --after-restore``: the operator's way out of a database that went backwards
(restored from a backup, or failed over to a standby that missed commits). Steps, in this
order (the procedure around it, docs/postgres-ha.md: pause the old database, reset, swap,
resume):

1. The old database (``--old-database-url``): its claims must be paused and no claim begun
   before that pause may still be open (else exit 1, nothing changed); then its mark, read
   after the pause, is a candidate (:mod:`allocator.restore_mark` argues each). Unreachable:
   exit 75, nothing changed; an operator who knows it is gone says
   ``--old-database-unreachable`` instead, and the mark then rests on the watermark and the
   restored server's clock (the bound that holds is in :mod:`allocator.restore_mark`). One
   of the two is required: which bound protects the IDs is the operator's explicit choice,
   never a default. The same database as the one reset is refused (exit 2).
2. ZooKeeper's watermark (the config's servers, without the chroot), read after the pause.
3. The restored database's fence, mark, layout and clock: the plan, each candidate and the
   winner, printed (stderr) before the confirmation (``--yes``, or an answer on a terminal;
   neither ``--yes`` nor ``--reason`` comes from the environment) and in ``--json``.
4. ``allocator.reset_after_restore`` (migration 0006, 0010; operator role, audited in
   ``allocator.pool_resets``): void every unclaimed block, move the mark past the floor
   (the larger of the watermark and the old database's mark) and past the restored
   server's clock + ``pool.max_clock_ahead_ms`` + the watermark's lag, advance the fence
   generation, and leave claims paused (the procedure's last step resumes them).
5. Write the new generation into ZooKeeper's generation znode (as ``fence rebase`` does:
   never lowering it), so nodes take the fence under it. If this step fails, the database
   is reset (recorded) and ZooKeeper's generation lags: nodes see the fence ahead of
   ZooKeeper and wait; ``allocator fence rebase`` (or this command again) completes it.

``--after-restore`` is required: there is no other kind of reset, and the flag makes the
command say what it is for where it is typed. ``--old-database-url`` and
``--old-database-unreachable`` are typed options too (never from the environment): a
variable left over from an earlier restore would name the wrong database.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import psycopg

from allocator import claim_pause, db, fence, redact, restore_mark, status, zkclient
from allocator import config as config_mod
from allocator.commands import options
from allocator.commands.fence_cmd import (
    audited_options,
    check_confirmable,
    write_generation,
)
from allocator.commands.options import CONFIG, OTHER, UNAVAILABLE, USAGE, config_options, exit_codes
from allocator.commands.ranges import FiniteFloatRange
from allocator.config import Config
from allocator.errors import AllocatorError, DatabaseUnavailableError, UsageError

MAX_REASON_CHARS = 1000


@dataclass(frozen=True)
class OldDatabase:
    """What the old database said after its pause."""

    high_water_id: int
    pause: db.OpenPause


@dataclass(frozen=True)
class Outcome:
    reset: db.Reset
    plan: restore_mark.MarkPlan
    watermark: fence.Watermark | None
    watermark_problem: str | None
    old_database: OldDatabase | None
    generation_znode: str
    zookeeper_written: bool

    def to_json(self) -> dict[str, Any]:
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


def check_reason(reason: str, what: str) -> str:
    if not reason.strip():
        raise UsageError(f"--reason must say why {what} (it is the audit record)")
    if len(reason) > MAX_REASON_CHARS:
        raise UsageError(
            f"--reason is {len(reason)} characters long; at most {MAX_REASON_CHARS} are kept"
        )
    return reason


def _database_of(url: str) -> tuple[str, str, str]:
    """(host, port, dbname) as libpq would resolve the URL's own parts ('' when absent)."""
    try:
        parts = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise UsageError(f"not a PostgreSQL URL: {redact.redact(url)}") from exc
    return tuple(str(parts.get(key) or "") for key in ("host", "port", "dbname"))  # type: ignore[return-value]


def check_old_database(url: str, old_url: str | None, old_unreachable: bool) -> None:
    """Step 1's usage rules: exactly one of the two options, and not the database reset."""
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
    """Step 1: the old database is paused, no claim begun before the pause is open, and
    its mark (read last, after both checks)."""
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
    yes: bool,
    *,
    old_url: str | None,
) -> Outcome:
    """The steps of the module docstring."""
    check_confirmable(yes)
    old = read_old_database(old_url, config) if old_url else None
    client = status.zookeeper_client(config, chroot=False)
    status.start(client, config)
    try:
        _servers, chroot = status.split_hosts(config.zookeeper.hosts)
        election_path = chroot + config.zookeeper.election_path
        with status.zookeeper_errors(config, "read the watermark"):
            zk_fence = status.read_zookeeper_fence(client, election_path, config)
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
        if not yes:
            for line in plan_lines(pool, watermark, problem, plan):
                click.echo(line, err=True)
            if not click.confirm("Reset the pool?", default=False, err=True):
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
            with status.zookeeper_errors(config, f"write the generation into {znode}"):
                # The chroot's parents keep the open ACL (others may share them): only the
                # chroot and what lies below it get ours.
                zkclient.ensure_chroot(client, chroot, acl, lambda p: status.wait(p, config))
                status.wait(client.ensure_path_async(election_path, acl=acl), config)
                written = write_generation(client, znode, result.new_generation, acl, config)
        except AllocatorError as exc:
            raise type(exc)(
                f"the pool is reset in the database (generation {result.new_generation}, "
                "recorded in allocator.pool_resets), but ZooKeeper's generation was not "
                "updated; run `allocator fence rebase` to complete it"
            ) from exc
    finally:
        status.close(client)
    return Outcome(result, plan, watermark, problem, old, znode, written.written)


def plan_lines(
    pool: db.PoolStatus,
    watermark: fence.Watermark | None,
    problem: str | None,
    plan: restore_mark.MarkPlan,
) -> list[str]:
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


@click.group("pool", epilog=exit_codes(*options.GROUP_CODES))
def pool_group() -> None:
    """The pool of cut blocks: pause and resume claims, reset it after a database restore."""


def operator_options(record: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--reason`` (never from the environment), ``--json``, ``--database-url`` and the
    config options of ``pause`` and ``resume``: ``fence_cmd.audited_options`` without
    ``--yes`` (the module docstring says why)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(
            [
                options.typed_option(
                    "--reason",
                    required=True,
                    help=f"Why (1..1000 characters); recorded with who and when in {record}.",
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


def _operator_url(
    database_url: str | None, config_path: Path | None, set_pairs: tuple[str, ...]
) -> tuple[Config, str]:
    flags = {"postgres.url": database_url} if database_url else {}
    config = config_mod.load_from_options(config_path, set_pairs, flags)
    return config, config.postgres.url.get_secret_value()


def pause_json(done: claim_pause.Paused) -> dict[str, Any]:
    p = done.pause
    return {
        "pause_id": p.pause_id,
        "paused_at": p.paused_at.isoformat(),
        "paused_by": p.paused_by,
        "reason": p.reason,
        "already_paused": p.already_paused,
        "waited_for": [
            {
                "pid": c.pid,
                "usename": c.usename,
                "application_name": c.application_name,
                "client_addr": c.client_addr,
                "state": c.state,
                "xact_start": c.xact_start.isoformat() if c.xact_start else None,
            }
            for c in done.waited_for
        ],
        "waited_s": round(done.waited_s, 3),
    }


def pause_lines(done: claim_pause.Paused) -> list[str]:
    p = done.pause
    since = p.paused_at.isoformat(timespec="seconds")
    first = (
        f"claims were already paused (pause {p.pause_id}, since {since} by {p.paused_by}: "
        f"{p.reason}); nothing changed"
        if p.already_paused
        else f"claims paused (pause {p.pause_id}, {since} by {p.paused_by}): {p.reason}"
    )
    count = len(done.waited_for)
    waited = (
        f"waited {done.waited_s:.1f} s for {count} claim(s) in flight to end: "
        + "; ".join(c.describe() for c in done.waited_for)
        if count
        else "no claim was in flight"
    )
    return [
        first,
        waited,
        "every claim begun before the pause has ended; claim_blocks answers AL004 until "
        "`allocator pool resume`",
    ]


@pool_group.command(
    "pause",
    epilog=exit_codes(
        (0, "claims are paused and no claim begun before the pause is still open"),
        OTHER,
        USAGE,
        (
            75,
            "PostgreSQL unreachable; or claims are paused but claims begun before the pause "
            "were still open at --timeout (each is named)",
        ),
        CONFIG,
    ),
)
@click.option(
    "--timeout",
    type=FiniteFloatRange(0.0, 3600.0, min_open=True),
    default=claim_pause.DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for the claims in flight to end (the default outlasts "
    "claim_blocks' 60 s idle bound).",
)
@operator_options("allocator.claim_pause_history")
def pause_command(
    timeout: float,
    reason: str,
    as_json: bool,
    database_url: str | None,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> None:
    """Pause claims (AL004) and wait until every claim in flight has ended."""
    check_reason(reason, "claims are paused")
    config, url = _operator_url(database_url, config_path, set_pairs)
    done = claim_pause.pause(
        url, reason, timeout, connect_timeout_s=config.postgres.connect_timeout_s
    )
    if as_json:
        click.echo(json.dumps(pause_json(done), indent=2))
        return
    for line in pause_lines(done):
        click.echo(line)


@pool_group.command(
    "resume",
    epilog=exit_codes(
        (0, "claims are served (also when they were not paused)"),
        OTHER,
        USAGE,
        UNAVAILABLE,
        CONFIG,
    ),
)
@operator_options("allocator.claim_pause_history")
def resume_command(
    reason: str,
    as_json: bool,
    database_url: str | None,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> None:
    """Resume claims paused by `pool pause` or by `pool reset --after-restore`."""
    check_reason(reason, "claims are resumed")
    config, url = _operator_url(database_url, config_path, set_pairs)
    done = claim_pause.resume(url, reason, connect_timeout_s=config.postgres.connect_timeout_s)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "was_paused": done.was_paused,
                    "pause_id": done.pause_id,
                    "paused_at": done.paused_at.isoformat() if done.paused_at else None,
                    "paused_by": done.paused_by,
                    "reason": done.reason,
                    "resumed_at": done.resumed_at.isoformat() if done.resumed_at else None,
                    "resumed_by": done.resumed_by,
                    "resume_reason": done.resume_reason,
                },
                indent=2,
            )
        )
    elif done.was_paused:
        click.echo(
            f"claims resumed (pause {done.pause_id} by {done.paused_by}: {done.reason}); "
            "claim_blocks hands out blocks again"
        )
    else:
        click.echo("claims were not paused; nothing changed")


@pool_group.command(
    "reset",
    epilog=exit_codes(
        (0, "done (what changed is printed); claims stay paused until `pool resume`"),
        (
            1,
            "cancelled at the prompt; the old database's claims are not paused, or claims "
            "begun before its pause are still open",
        ),
        OTHER,
        (
            2,
            "no --after-restore, no --yes and no terminal, a bad --reason, neither or both "
            "of --old-database-url and --old-database-unreachable, or the old database is the "
            "one reset",
        ),
        USAGE,
        UNAVAILABLE,
        CONFIG,
    ),
)
@options.typed_option(
    "--after-restore",
    is_flag=True,
    help="Required: the database was restored from a backup or failed over to a standby "
    "that missed commits.",
)
@options.typed_option(
    "--old-database-url",
    default=None,
    help="PostgreSQL URL (operator role) of the database that served until the restore, its "
    "claims paused: its mark, read now, is a floor of the new mark. No password in it: "
    "use PGPASSWORD or a PGPASSFILE.",
)
@options.typed_option(
    "--old-database-unreachable",
    is_flag=True,
    help="The old database cannot be read (down, lost, or restored in place): the mark rests "
    "on the watermark and this server's clock (docs/postgres-ha.md).",
)
@audited_options("allocator.pool_resets")
def reset_command(
    after_restore: bool,
    old_database_url: str | None,
    old_database_unreachable: bool,
    reason: str,
    yes: bool,
    as_json: bool,
    database_url: str | None,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> None:
    """Void every unclaimed block, move the mark and advance the fence after a restore."""
    if not after_restore:
        raise UsageError("pool reset needs --after-restore (the only reset there is)")
    check_reason(reason, "the pool is reset")
    if old_database_url and redact.carries_secret(old_database_url):
        raise UsageError(
            "--old-database-url must not carry a password on the command line (every process "
            "list shows it): leave it out and give it through PGPASSWORD or a PGPASSFILE"
        )
    config, url = _operator_url(database_url, config_path, set_pairs)
    check_old_database(url, old_database_url, old_database_unreachable)
    outcome = reset(config, url, reason, yes, old_url=old_database_url)
    if as_json:
        click.echo(json.dumps(outcome.to_json(), indent=2))
        return
    for line in outcome_lines(outcome):
        click.echo(line)

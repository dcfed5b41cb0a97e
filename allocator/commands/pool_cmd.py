"""``allocator pool reset --after-restore``: the operator's way out of a database that went
backwards (restored from a backup, or failed over to a standby that missed commits).

Rules:

- Steps, in this order:

  1. Connect to ZooKeeper (the config's servers, without the chroot) and read the
     watermark beside the election path (:mod:`allocator.fence`); read the database's
     fence and mark. Nothing changes yet; an unreachable server fails the command here.
  2. Show the plan and get the confirmation (``--yes``, or an answer on a terminal; as
     ``fence rebase``: neither ``--yes`` nor ``--reason`` comes from the environment).
  3. ``allocator.reset_after_restore`` in the database (migration 0006, operator role,
     audited in ``allocator.pool_resets``): void every unclaimed block, move the mark past
     ``db_now + pool.max_clock_ahead_ms`` and past the watermark's mark, advance the fence
     generation.
  4. Write the new generation into ZooKeeper's generation znode (as ``fence rebase`` does:
     never lowering it), so nodes take the fence under it. If this step fails, the database
     is reset (recorded) and ZooKeeper's generation lags: nodes see the fence ahead of
     ZooKeeper and wait; ``allocator fence rebase`` (or this command again) completes it.
- ``--after-restore`` is required: there is no other kind of reset, and the flag makes the
  command say what it is for where it is typed.
- The command does not stop consumers. Claims made on the restored database before the
  reset can hand a block out again: keep consumers away from it until the reset has run
  (docs/postgres-ha.md says how).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from allocator import config as config_mod
from allocator import db, fence, status, zkclient
from allocator.commands import options
from allocator.commands.fence_cmd import (
    audited_options,
    check_confirmable,
    check_reason,
    write_generation,
)
from allocator.commands.options import CONFIG, OTHER, UNAVAILABLE, USAGE, exit_codes
from allocator.config import Config
from allocator.errors import AllocatorError, UsageError


@dataclass(frozen=True)
class Outcome:
    reset: db.Reset
    watermark: fence.Watermark | None
    watermark_problem: str | None
    generation_znode: str
    zookeeper_written: bool

    def to_json(self) -> dict[str, Any]:
        r = self.reset
        return {
            "voided_blocks": r.voided_blocks,
            "old_high_water_id": r.old_high_water_id,
            "new_high_water_id": r.new_high_water_id,
            "old_generation": r.old_generation,
            "old_epoch": r.old_epoch,
            "new_generation": r.new_generation,
            "watermark": self.watermark.to_json() if self.watermark else None,
            "watermark_problem": self.watermark_problem,
            "generation_znode": self.generation_znode,
            "zookeeper_written": self.zookeeper_written,
        }


def reset(config: Config, url: str, reason: str, yes: bool) -> Outcome:
    """The four steps of the module docstring."""
    check_confirmable(yes)
    client = status.zookeeper_client(config, chroot=False)
    status.start(client, config)
    try:
        _servers, chroot = status.split_hosts(config.zookeeper.hosts)
        election_path = chroot + config.zookeeper.election_path
        with status.zookeeper_errors(config, "read the watermark"):
            zk_fence = status.read_zookeeper_fence(client, election_path, config)
        watermark, problem = zk_fence.watermark, zk_fence.watermark_problem
        pool, _terms = db.read_status(
            url, history_limit=1, connect_timeout_s=config.postgres.connect_timeout_s
        )
        if not yes:
            click.echo(
                f"database   mark {pool.high_water_id}, fence "
                f"{fence.Token(pool.generation, pool.epoch)}",
                err=True,
            )
            click.echo(
                "watermark  "
                + (
                    f"{watermark.token}, mark {watermark.high_water_id}"
                    if watermark
                    else problem or "-"
                ),
                err=True,
            )
            click.echo(
                "reset: void every unclaimed block, move the mark past the database clock + "
                f"{config.pool.max_clock_ahead_ms} ms and past the watermark, advance the fence "
                "generation",
                err=True,
            )
            if not click.confirm("Reset the pool?", default=False, err=True):
                raise AllocatorError("cancelled; nothing changed")
        result = db.reset_after_restore(
            url,
            reason,
            watermark.high_water_id if watermark else -1,
            config.pool.max_clock_ahead_ms,
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
    return Outcome(result, watermark, problem, znode, written.written)


def outcome_lines(outcome: Outcome) -> list[str]:
    r = outcome.reset
    return [
        f"pool reset: {r.voided_blocks} unclaimed blocks voided (claimed by "
        "'allocator:voided-by-reset')",
        f"mark       {r.old_high_water_id} -> {r.new_high_water_id}",
        f"fence      {fence.Token(r.old_generation, r.old_epoch)} -> generation "
        f"{r.new_generation}, epoch 0 (recorded in allocator.pool_resets and fence_history)",
        f"zookeeper  generation {r.new_generation} in {outcome.generation_znode}"
        + ("" if outcome.zookeeper_written else " (already there)"),
        "nodes take the fence under the new generation and cut a fresh pool; consumers may "
        "claim again once a leader has cut",
    ]


@click.group("pool", epilog=exit_codes(*options.GROUP_CODES))
def pool_group() -> None:
    """The pool of cut blocks: reset it after a database restore."""


@pool_group.command(
    "reset",
    epilog=exit_codes(
        (0, "done (what changed is printed)"),
        (1, "cancelled at the prompt"),
        OTHER,
        (2, "no --after-restore, no --yes and no terminal, or a bad --reason"),
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
@audited_options("allocator.pool_resets")
def reset_command(
    after_restore: bool,
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
    check_reason(reason)
    flags = {"postgres.url": database_url} if database_url else {}
    config = config_mod.load_from_options(config_path, set_pairs, flags)
    outcome = reset(config, config.postgres.url.get_secret_value(), reason, yes)
    if as_json:
        click.echo(json.dumps(outcome.to_json(), indent=2))
        return
    for line in outcome_lines(outcome):
        click.echo(line)

"""``allocator status``, ``allocator watch`` and ``allocator step-down`` (docs/design.md §7, §10).

Read-only but step-down. A state that stops all cutting (the fence ahead of ZooKeeper, the
database behind it) or all claiming (a pause) is one loud line in every view, never buried
in a table. ``--json`` of ``status`` is docs/schemas/status.schema.json.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from pathlib import Path
from typing import Any

import click

from allocator import config as config_mod
from allocator.commands.options import (
    CONFIG,
    OTHER,
    SECOND,
    UNREACHABLE,
    USAGE,
    Duration,
    config_options,
    exit_codes,
)
from allocator.config import runway
from allocator.core import errors
from allocator.core.errors import AllocatorError, ConfigError, LeaderUnavailableError
from allocator.core.exits import Exit

WATCH_INTERVAL_S = 0.25
POOL_LINE_EVERY_S = 5.0

Emit = Callable[[str, str, dict[str, Any]], None]
"""``watch``'s output: (event, its text lines, its JSON line's fields)."""


@click.command(
    "status",
    epilog=exit_codes(
        (Exit.OK, "the status was printed (a fence ahead or behind is a line of it, not an exit)"),
        USAGE,
        UNREACHABLE,
        CONFIG,
        OTHER,
    ),
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@config_options
def status(as_json: bool, config_path: Path | None, set_pairs: tuple[str, ...]) -> None:
    """Leader, contenders in election order, pool level and the last handovers."""
    from allocator.cluster_status import gather

    config = config_mod.load_from_options(config_path, set_pairs)
    data = gather(config).to_json()
    coverage_warning = _add_coverage(data, config)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    leader = data["leader"]
    if leader:
        click.echo(
            f"leader      {leader['name']} (pid {leader['pid']} on {leader['host']}), "
            f"epoch {leader['epoch']}, generation {leader['generation']}, "
            f"since {leader['since']}"
        )
    else:
        click.echo("leader      none")
    contenders = ", ".join(_contender(c) for c in data["contenders"]) or "none"
    click.echo(f"contenders  {contenders}")
    for line in election_lines(data["election"]):
        click.echo(line)
    for line in fence_lines(data["fence"]):
        click.echo(line)
    for line in claims_lines(data):
        click.echo(line)
    pool = data["pool"]
    runway_text = "unknown" if pool["runway_s"] is None else f"{pool['runway_s']:.0f} s"
    click.echo(
        f"pool        {pool['available_blocks']} blocks, {pool['available_ids']} IDs, "
        f"runway {runway_text} (a handover needs {pool['runway_needed_s']:g} s), "
        f"high-water mark {pool['high_water_id']}"
    )
    age_line = block_age_line(data.get("block_age"))
    if age_line:
        click.echo(age_line)
    if coverage_warning:
        click.echo(f"warning: {coverage_warning}", err=True)
    click.echo("handovers")
    for term in data["handovers"]:
        token = f"{term['generation']}:{term['epoch']:#x}"  # as the fence line and node logs
        click.echo(
            f"  {token:<20} {term['holder']:<16} elected {term['elected_at']}"
            f"  ended {term['ended_at'] or '-'} ({term['end_reason'] or 'leading'})"
        )


def claims_lines(data: dict[str, Any]) -> list[str]:
    """The loud line while an operator has paused claims (nothing when they are served)."""
    if not data["pool"].get("claims_paused"):
        return []
    pause = data.get("claims_pause")
    why = f" since {pause['paused_at']} by {pause['paused_by']}: {pause['reason']}" if pause else ""
    return [
        f"!! CLAIMS PAUSED{why}; claim_blocks answers AL004 (clients retry) until "
        "`allocator pool resume --reason TEXT`."
    ]


def block_age_line(age: dict[str, Any] | None) -> str | None:
    """The ``ID age`` line: the oldest unclaimed block's age beside the bound, and whether a
    leader serves (what holds the bound); None before migration 0011."""
    if age is None:
        return None
    oldest = age["oldest_unclaimed_age_s"]
    bound = age["max_block_age_s"]
    oldest_text = "pool empty" if oldest is None else f"oldest unclaimed block {oldest:.0f} s old"
    bound_text = "no bound set yet" if bound is None else f"bound {bound:g} s"
    if age["leader_serves"]:
        serving = "a leader serves"
    elif age["serve_aged_without_leader"] is False:
        serving = "NO LEADER SERVES: aged blocks are refused"
    else:
        serving = "NO LEADER SERVES: older blocks are handed out"
    over = " (PAST THE BOUND)" if None not in (oldest, bound) and oldest > bound else ""
    return f"ID age      {oldest_text}{over}, {bound_text}; {serving}"


def _add_coverage(data: dict[str, Any], config: config_mod.Config) -> str | None:
    """Put what the pool must cover (by this configuration) into the status; the warning
    when ``pool.max_blocks`` cannot cover a handover at the measured claim rate."""
    pool = data["pool"]
    pool.update(
        runway_needed_s=runway.needed_runway_s(config),
        covered_rate_blocks_per_s=round(runway.covered_rate_blocks_per_s(config), 1),
    )
    warning = runway.rate_warning(config, pool["claim_rate_blocks_per_s"])
    pool["covers_handover"] = warning is None
    return warning


def _contender(contender: dict[str, Any]) -> str:
    """``name``, with what it advertises when that is not all well (``db down``, …)."""
    notes = [
        f"{what} {'unknown' if contender[key] is None else bad}"
        for key, what, bad in (("db_ok", "db", "down"), ("clock_ok", "clock", "skewed"))
        if contender[key] is not True
    ]
    if contender.get("blocked"):
        notes.insert(0, f"blocked: {contender['blocked']}")
    if contender["problem"]:
        notes.insert(0, "data unparsable")
    return f"{contender['name']} ({', '.join(notes)})" if notes else str(contender["name"])


def election_lines(election: dict[str, Any]) -> list[str]:
    """The text view of the ``election`` object: one line per znode that is ignored or
    whose data does not parse (nothing when all is well)."""
    lines = [
        f"!! election znode {entry['znode']}: data does not parse ({entry['problem']}); it "
        "keeps its place in the queue"
        for entry in election["unparsable"]
    ]
    lines += [
        f"election    ignored {entry['znode']} ({entry['reason']})" for entry in election["ignored"]
    ]
    return lines


def fence_lines(report: dict[str, Any]) -> list[str]:
    """The text view of a ``fence`` object (``status``, ``fence status``); the loud line
    first when the fence is ahead of ZooKeeper, the database is behind its watermark, or
    ZooKeeper's generation is unreadable."""
    holder = report["holder"] or "nobody"
    zk_generation = report["zookeeper_generation"]
    lines = [
        f"fence       generation {report['generation']}, epoch {report['epoch']:#x} "
        f"(held by {holder}); ZooKeeper: generation "
        f"{'?' if zk_generation is None else zk_generation} in {report['generation_znode']}, "
        f"newest zxid {report['zookeeper_newest_zxid']:#x}"
    ]
    if report["ahead_of_zookeeper"]:
        lines.insert(0, ahead_line(report))
    if report["database_behind_zookeeper"]:
        lines.insert(0, behind_line(report))
    if report["problem"]:
        lines.insert(0, unreadable_line(report))
    return lines


def unreadable_line(report: dict[str, Any]) -> str:
    """The loud line while ZooKeeper's fence generation cannot be read."""
    return (
        f"!! FENCE GENERATION UNREADABLE: {report['problem']}; no new leader can take the "
        "fence. Run `allocator fence rebase --reason TEXT` to rewrite it."
    )


def behind_line(report: dict[str, Any]) -> str:
    """The loud line while the database is behind ZooKeeper's watermark (a restore)."""
    return (
        f"!! DATABASE BEHIND ZOOKEEPER: {report['database_behind_zookeeper']}; the database "
        "was restored or failed over to a standby that missed commits. No node takes the "
        "fence or cuts; pause claims (`allocator pool pause`) and follow the restore procedure "
        "(`allocator pool reset --after-restore`, docs/postgres-ha.md)."
    )


def ahead_line(report: dict[str, Any]) -> str:
    """The loud line while the fence is ahead of ZooKeeper: no node can take it until an
    operator re-bases it, so it stops all cutting."""
    return (
        f"!! FENCE AHEAD OF ZOOKEEPER: the database's fence "
        f"{report['generation']}:{report['epoch']:#x} is newer than anything this ensemble "
        f"issued (generation {report['zookeeper_generation']}, newest zxid "
        f"{report['zookeeper_newest_zxid']:#x}); no node can take it and nothing is cut. "
        "If the ensemble was wiped or restored, run `allocator fence rebase --reason TEXT`."
    )


@click.command(
    "watch",
    epilog=exit_codes(
        (
            Exit.OK,
            "stopped after --duration or by Ctrl-C (an unreachable server is a line, not an exit)",
        ),
        USAGE,
        (Exit.CONFIG, "invalid configuration (every problem named)"),
        OTHER,
    ),
)
@click.option(
    "--duration",
    type=Duration(bare_unit="s"),
    default=None,
    show_envvar=True,
    help="Stop after this long (30s, 5m, 1h; a bare number of seconds is deprecated).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    show_envvar=True,
    help="JSON lines: one object per line, each with time, event and its fields.",
)
@config_options
def watch(
    duration: timedelta | None,
    as_json: bool,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> None:
    """Live view of leadership and pool: handovers as they happen.

    With --json every line is one JSON object with "time" (ISO-8601 UTC) and "event":
    leader (leader, epoch, queue), fence (generation, zookeeper_generation,
    ahead_of_zookeeper, problem), pool (available_blocks, available_ids, runway_s,
    claims_paused),
    election (unparsable, ignored) or unavailable (error).
    """
    from allocator.cluster_status import gather

    config = config_mod.load_from_options(config_path, set_pairs)
    emit = _json_line if as_json else _text_line
    limit_s = None if duration is None else duration.total_seconds()
    started = time.monotonic()
    last_leader: tuple[object, ...] | None = None
    last_fence: tuple[object, ...] | None = None
    last_election: list[str] = []
    last_pool_line = 0.0
    try:
        while limit_s is None or time.monotonic() - started < limit_s:
            try:
                data = gather(config, history_limit=1, rebase_limit=0).to_json()
            except AllocatorError as exc:
                error = errors.describe(exc)
                emit("unavailable", f"unavailable: {error}", {"error": error})
                time.sleep(1.0)
                continue
            last_election = _watch_election(data["election"], last_election, emit)
            leader = data["leader"]
            key = (leader and leader["name"], leader and leader["epoch"])
            if key != last_leader:
                who = "none" if not leader else f"{leader['name']} epoch {leader['epoch']}"
                names = [c["name"] for c in data["contenders"]]
                fields = {
                    "leader": leader and leader["name"],
                    "epoch": leader and leader["epoch"],
                    "queue": names,
                }
                emit("leader", f"leader {who}   queue: {' > '.join(names) or '-'}", fields)
                last_leader = key
            last_fence = _watch_fence(data["fence"], last_fence, emit)
            if time.monotonic() - last_pool_line >= POOL_LINE_EVERY_S:
                pool = data["pool"]
                keys = ("available_blocks", "available_ids", "runway_s")
                fields = {k: pool[k] for k in keys}
                fields["claims_paused"] = bool(pool.get("claims_paused"))
                paused = " (claims paused)" if fields["claims_paused"] else ""
                emit("pool", f"pool {pool['available_blocks']} blocks{paused}", fields)
                last_pool_line = time.monotonic()
            time.sleep(WATCH_INTERVAL_S)
    except KeyboardInterrupt:
        pass


def _text_line(event: str, text: str, fields: dict[str, Any]) -> None:
    for line in text.splitlines():
        click.echo(f"{_now()} {line}")


def _json_line(event: str, text: str, fields: dict[str, Any]) -> None:
    now = datetime.now(UTC).isoformat(timespec="milliseconds")
    click.echo(json.dumps({"time": now, "event": event, **fields}))


@click.command(
    "step-down",
    epilog=exit_codes(
        (Exit.OK, "the leader is stepping down"),
        USAGE,
        (Exit.FAILED, "the leader's znode does not parse, or it refused for another reason"),
        OTHER,
        (
            Exit.TEMPFAIL,
            "no leader to ask (none in the election, unreachable, or no longer leading), or "
            "ZooKeeper unreachable: retry later",
        ),
        CONFIG,
        (Exit.CONFIG, "node.admin_token is not set, or the leader refused it"),
    ),
)
@click.option(
    "--timeout",
    type=Duration(maximum=3600 * SECOND, bare_unit="s"),
    default="5s",
    show_envvar=True,
    help="HTTP timeout (5s, 500ms; a bare number of seconds is deprecated).",
)
@click.option("--json", "as_json", is_flag=True, show_envvar=True, help="Print one JSON object.")
@config_options
def step_down(
    timeout: timedelta, as_json: bool, config_path: Path | None, set_pairs: tuple[str, ...]
) -> None:
    """Ask the current leader to hand over at once (needs node.admin_token)."""
    # The leader is the first contender in the election znodes, asked over its admin HTTP.
    # No token, or one the leader refuses: a configuration error (78); no leader to ask (none
    # in the election, unreachable, no longer leading): temporary (75).
    from allocator.cluster_status import read_contenders_once

    config = config_mod.load_from_options(config_path, set_pairs)
    token = config.node.admin_token.get_secret_value()
    if not token:
        raise ConfigError(
            "node.admin_token is not set (ALLOCATOR_NODE_ADMIN_TOKEN_FILE names a file that "
            "holds it; or ALLOCATOR_NODE_ADMIN_TOKEN, or the config file)"
        )
    contenders = read_contenders_once(config)
    if not contenders:
        raise LeaderUnavailableError("no node is in the election: no leader to ask")
    if contenders[0].problem is not None:
        # Not what our nodes write: do not send the token to an address someone else chose.
        raise AllocatorError(
            f"the leader's znode {contenders[0].znode} holds data that does not parse "
            f"({contenders[0].problem}); not sending the admin token anywhere"
        )
    leader = contenders[0].identity
    if not leader.admin_address.startswith("http://"):
        raise AllocatorError(f"leader {leader.name} publishes no admin URL")
    request = urllib.request.Request(  # noqa: S310 (scheme checked above)
        f"{leader.admin_address}/step-down",
        method="POST",
        headers={"Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(  # noqa: S310
            request, timeout=timeout.total_seconds()
        ) as response:
            body = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        with exc:  # its socket
            answer = _error_of(exc.read())
        if exc.code == HTTPStatus.CONFLICT:
            raise LeaderUnavailableError(
                f"{leader.name} no longer leads (HTTP 409): the election moved on; see "
                "`allocator status`"
            ) from None  # the code says it all; the cause would only repeat it
        if exc.code in (HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN):
            raise ConfigError(
                f"leader {leader.name} refused node.admin_token: HTTP {exc.code} ({answer}); "
                "give the token the nodes were configured with"
            ) from None
        raise AllocatorError(f"leader {leader.name} refused: HTTP {exc.code} ({answer})") from None
    except OSError as exc:
        raise LeaderUnavailableError(
            f"cannot reach leader {leader.name} at {leader.admin_address}"
        ) from exc
    if as_json:
        document = {
            "leader": leader.name,
            "admin_url": leader.admin_address,
            "stepping_down": body.get("stepping_down") if isinstance(body, dict) else None,
        }
        click.echo(json.dumps(document))
    else:
        click.echo(
            f"{leader.name} is stepping down ({leader.admin_address}); the next node in the "
            "queue takes over"
        )


def _error_of(raw: bytes) -> str:
    """The admin server's one-line answer (``{"error": ...}``), or its text, shortened."""
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
        text = answer["error"]
    else:
        text = raw.decode("utf-8", errors="replace")
    text = " ".join(text.split())
    return text[:200] or "no answer body"


def _watch_election(election: dict[str, Any], last: list[str], emit: Emit) -> list[str]:
    """Emits the election's problem lines (one ``election`` JSON line) when they change."""
    lines = election_lines(election)
    if lines != last:
        fields = {k: election[k] for k in ("unparsable", "ignored")}
        emit("election", "\n".join(lines), fields)
    return lines


def _watch_fence(
    report: dict[str, Any], last: tuple[object, ...] | None, emit: Emit
) -> tuple[object, ...]:
    """Emits a fence line when the generation, the ahead state or a problem changes."""
    key = (report["generation"], report["ahead_of_zookeeper"], report["problem"])
    if key == last:
        return key
    if report["problem"]:
        text = unreadable_line(report)
    elif report["ahead_of_zookeeper"]:
        text = ahead_line(report)
    else:
        note = " (no longer ahead of ZooKeeper)" if last is not None and last[1] else ""
        text = (
            f"fence generation {report['generation']}, ZooKeeper generation "
            f"{report['zookeeper_generation']}{note}"
        )
    fields = {
        k: report[k]
        for k in ("generation", "zookeeper_generation", "ahead_of_zookeeper", "problem")
    }
    emit("fence", text, fields)
    return key


def _now() -> str:
    return time.strftime("%H:%M:%S")

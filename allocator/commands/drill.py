"""``allocator drill``: failover rehearsals, measured and judged (docs/design.md §9, §10); a thin
wrapper over :mod:`allocator.drill.plan`, options in, a table or JSON out. Progress lines go
to stderr.
"""

from __future__ import annotations

import json
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType

import click

from allocator.commands import options
from allocator.commands.options import (
    CONFIG,
    EMBEDDED_CLUSTER,
    INTERRUPTED,
    OTHER,
    USAGE,
    Duration,
    exit_codes,
)
from allocator.core import verify
from allocator.core.exits import Exit
from allocator.drill import output, plan
from allocator.drill.observe import DrillError
from allocator.drill.scenarios import ALL, MIXED, ROLLING_UPGRADE, SCENARIOS
from allocator.local import nodes as nodes_mod
from allocator.local.cluster import MAX_NODES

DEFAULT_STATE_DIR = Path(".run/drill")
OLD_DURATION_ENV = "ALLOCATOR_DRILL_DURATION_S"


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM as Ctrl-C: the drill heals what it broke and stops its own cluster first."""
    raise KeyboardInterrupt


@click.command(
    "drill",
    epilog=exit_codes(
        (Exit.OK, "every round passed, no violation, and (a soak) no node grew past the bound"),
        (
            Exit.FAILED,
            "a round failed, a violation was found or a node grew (the table and files are "
            "still written)",
        ),
        INTERRUPTED,
        OTHER,
        (Exit.USAGE, "a scenario the target cannot run"),
        USAGE,
        *EMBEDDED_CLUSTER,
        (CONFIG[0], "with --config: invalid configuration"),
    ),
)
@click.option(
    "--scenario",
    type=click.Choice([*SCENARIOS, MIXED, ALL, ROLLING_UPGRADE]),
    default="kill",
    show_envvar=True,
    help="Fault applied each round (`all`: each scenario in turn; `mixed`: a random, "
    "seeded schedule of them, sometimes two at once; `rolling-upgrade`: a rolling upgrade "
    "from --from-release, never part of `all`).",
)
@click.option(
    "--rounds",
    type=click.IntRange(1, 10_000),
    default=20,
    show_envvar=True,
    help="Rounds per scenario (mixed: rounds in all).",
)
@click.option(
    "--from-release",
    default=None,
    show_envvar=True,
    help="rolling-upgrade: the release upgraded from, a folder with .venv/bin/allocator or a "
    "git revision of this clone (built by scripts/build-release.sh into .cache/releases/).",
)
@click.option("--seed", type=int, default=None, show_envvar=True, help="Seed of the schedule.")
@options.duration_option(
    "--duration",
    kind=Duration(bare_unit="s"),
    default=None,
    into="duration_s",
    convert=timedelta.total_seconds,
    old_envvar=OLD_DURATION_ENV,
    help="Soak: run the mixed schedule this long (90s, 30m, 2h), sampling each node's "
    "memory, open files and threads; growth past the bound fails the run.",
)
@options.nodes_option(
    2,
    MAX_NODES,
    nodes_mod.DEFAULT_NODES,
    help="Allocator nodes in the election (the drill's own cluster).",
)
@options.zk_servers_option
@options.session_timeout_option(
    nodes_mod.DEFAULT_SESSION_TIMEOUT_MS,
    help="The nodes' ZooKeeper session timeout (the drill's own cluster).",
)
@options.state_dir_option(DEFAULT_STATE_DIR, help="State folder of the drill's own cluster.")
@click.option(
    "--against",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Drill a running `allocator local` cluster in this folder (never stopped).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Drill a deployed cluster through its surfaces (only step-down).",
)
@options.database_url_option(
    help="With --config: a URL that may read the allocator schema and claim "
    "[default: postgres.url]."
)
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    show_envvar=True,
    help="Also write drill.json, drill.md and a PNG timeline (drill.png) here.",
)
@options.json_out_option("drill")
@options.json_option()
@options.keep_option(
    help="Leave the drill's own cluster running (stop it: allocator local down --state-dir ...)."
)
def drill(
    scenario: str,
    rounds: int,
    from_release: str | None,
    seed: int | None,
    duration_s: float | None,
    nodes: int,
    zk_servers: int | None,
    session_timeout_ms: int,
    state_dir: Path,
    against: Path | None,
    config_path: Path | None,
    database_url: str | None,
    report_dir: Path | None,
    json_out: Path | None,
    as_json: bool,
    keep: bool,
) -> None:
    """Rehearse failovers under faults, with consumers claiming throughout, and judge them."""
    request = plan.Request(
        scenario=scenario,
        rounds=rounds,
        seed=seed,
        nodes=nodes,
        zk_servers=zk_servers,
        session_timeout_ms=session_timeout_ms,
        state_dir=state_dir,
        against=against,
        config_path=config_path,
        database_url=database_url,
        keep=keep,
        duration_s=duration_s,
        from_release=from_release,
    )
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        outcome = plan.run(request, _progress)
    except KeyboardInterrupt:
        _progress("interrupted")
        raise click.Abort from None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # The JSON is always written (--json prints it instead of the table); with one scenario
    # it carries that scenario's keys at the top (docs/design.md §10). A failed run exits 1
    # with the table and files still written.
    home = against or state_dir
    out = json_out or home / f"drill-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    output.write_json(out, outcome.document)
    if report_dir is not None:
        from allocator.drill import report  # matplotlib: only paid for when asked

        files = report.write_report(report_dir, outcome.document)
        _progress(f"report written to {files.markdown} and {files.png}")
    if as_json:
        click.echo(json.dumps(outcome.document, indent=2))
    else:
        for line in output.render_table(outcome.results):
            click.echo(line)
        for line in output.render_by_fault(outcome.results):
            click.echo(line)
        for line in output.render_upgrades(outcome.results):
            click.echo(line)
        found = output.render_violations(outcome.results)
        if found:
            click.echo("violations:")
        for line in found:
            click.echo(f"  {line}")
        click.echo(f"JSON written to {out}")
    if not outcome.ok:
        failed = sum(r.failed_rounds for r in outcome.results)
        violations = [v for r in outcome.results for v in r.violations]
        grew = (
            ""
            if outcome.resources_ok
            else ", resources grew past the bound or a node was not judged (soak too short?)"
        )
        raise DrillError(
            f"{failed} failed round(s), {len(violations)} violation(s) "
            f"({verify.counts_text(violations)}){grew}; see {out}"
        )


def _progress(message: str) -> None:
    click.echo(f"[drill {time.strftime('%H:%M:%S')}] {message}", err=True)

"""``allocator drill``: leader handover drills on the embedded cluster, measured (DESIGN §9).

Rules: brings up its own embedded cluster with :class:`LocalCluster` in ``--state-dir``
(default ``.run/drill``; a cluster already running there is reused, with the requested node
count and session timeout), runs the scenarios of :mod:`allocator.drill` while consumers
claim throughout, prints one table line per scenario and writes the JSON (``--json-out``,
default ``<state-dir>/drill-<UTC timestamp>.json``). ``--json`` prints the same JSON
instead of the table. With one scenario the JSON is that scenario's object (DESIGN §10:
``scenario``, ``rounds``, ``violations``, ``handover_ms`` {p50, p90, p99, max},
``stale_writes_rejected``, ``claim_errors``, and more); with ``--scenario all`` it is
``{"scenarios": [<one object per scenario>]}``. Both carry ``cluster``: the state folder,
every pid the drill saw (servers, supervisor, every node incarnation), whether it stopped
the cluster, and any of those pids still alive after.

The cluster is stopped at the end (by pid, through the manager; also on error, Ctrl-C and
SIGTERM) unless ``--keep``. Progress lines go to stderr. The verdict is the one invariant
checker (:mod:`allocator.verify`): each violation is named (invariant and message) in the
JSON's ``violations`` and, after the table, one line each. Exit status: 0 when every round
handed over and no violation was found; 1 otherwise (the table and JSON are still written;
the error line counts the violations per invariant). Timings are reported, never judged.
"""

from __future__ import annotations

import json
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import click

from allocator import drill as drill_mod
from allocator import verify
from allocator.drill import Drill, DrillError, ScenarioResult
from allocator.local import nodes as nodes_mod
from allocator.local.cluster import MAX_NODES, LocalCluster
from allocator.local.processes import is_pid_alive

DEFAULT_STATE_DIR = Path(".run/drill")
ALL = "all"


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@click.command("drill")
@click.option(
    "--scenario",
    type=click.Choice([*drill_mod.SCENARIOS, ALL]),
    default=drill_mod.SIGKILL,
    show_envvar=True,
    help="Fault applied to the leader each round: SIGKILL, SIGTERM (graceful), POST "
    "/step-down; `all` runs the three in turn.",
)
@click.option(
    "--rounds",
    type=click.IntRange(1, 1000),
    default=20,
    show_envvar=True,
    help="Rounds per scenario.",
)
@click.option(
    "--nodes",
    type=click.IntRange(2, MAX_NODES),
    default=nodes_mod.DEFAULT_NODES,
    show_envvar=True,
    help="Allocator nodes in the election.",
)
@click.option(
    "--zk",
    "zk_servers",
    type=click.IntRange(1, 7),
    default=3,
    show_envvar=True,
    help="ZooKeeper servers of a new cluster (an existing one must have as many).",
)
@click.option(
    "--session-timeout-ms",
    type=click.IntRange(min=1),
    default=nodes_mod.DEFAULT_SESSION_TIMEOUT_MS,
    show_envvar=True,
    help="The nodes' ZooKeeper session timeout (nodes restart if it changes).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_STATE_DIR,
    show_envvar=True,
    help="State folder of the drill's cluster.",
)
@click.option(
    "--json-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    show_envvar=True,
    help="Where to write the JSON. [default: <state-dir>/drill-<time>.json]",
)
@click.option(
    "--json", "as_json", is_flag=True, show_envvar=True, help="Print the JSON instead of the table."
)
@click.option(
    "--keep",
    is_flag=True,
    show_envvar=True,
    help="Leave the cluster running (stop it: allocator local down --state-dir ...).",
)
def drill(
    scenario: str,
    rounds: int,
    nodes: int,
    zk_servers: int,
    session_timeout_ms: int,
    state_dir: Path,
    json_out: Path | None,
    as_json: bool,
    keep: bool,
) -> None:
    """Measure leader handover times under faults, with consumers claiming throughout."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    scenarios = list(drill_mod.SCENARIOS) if scenario == ALL else [scenario]
    cluster = LocalCluster(
        state_dir, zk_servers, nodes=nodes, session_timeout_ms=session_timeout_ms
    )
    out = json_out or cluster.state_dir / f"drill-{_timestamp()}.json"
    results: list[ScenarioResult] = []
    session: Drill | None = None
    existed = cluster.exists()
    came_up = False
    stopped = False
    try:
        _progress(
            f"starting the cluster in {cluster.state_dir} ({zk_servers} ZooKeeper, "
            f"{nodes} nodes, session timeout {session_timeout_ms} ms)"
        )
        info = cluster.up(migrate=True, nodes=nodes)
        came_up = True
        session = Drill(cluster, info, progress=_progress)
        session.open()
        for name in scenarios:
            _progress(f"{name}: {rounds} rounds")
            results.append(session.run(name, rounds))
    except KeyboardInterrupt:
        _progress("interrupted")
        raise click.Abort from None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second TERM must not cut cleanup
        if session is not None:
            session.close()
        # A cluster that was there before and refused the request is left as it was.
        if not keep and (came_up or not existed):
            _progress("stopping the cluster")
            cluster.down()
            stopped = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert session is not None
    pids = sorted(session.pids)
    cluster_json: dict[str, Any] = {
        "state_dir": str(cluster.state_dir),
        "pids": pids,
        "stopped": stopped,
        "left_running": [p for p in pids if is_pid_alive(p)] if stopped else [],
    }
    data = drill_mod.document(results, cluster_json, single=len(results) == 1)
    drill_mod.write_json(out, data)
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        for line in drill_mod.render_table(results):
            click.echo(line)
        found = drill_mod.render_violations(results)
        if found:
            click.echo("violations:")
        for line in found:
            click.echo(f"  {line}")
        click.echo(f"JSON written to {out}")
    _progress(f"JSON written to {out}")
    failed = sum(r.failed_rounds for r in results)
    violations = [v for r in results for v in r.violations]
    if failed or violations:
        raise DrillError(
            f"{failed} failed round(s), {len(violations)} violation(s) "
            f"({verify.counts_text(violations)}); see {out}"
        )


def _progress(message: str) -> None:
    click.echo(f"[drill {time.strftime('%H:%M:%S')}] {message}", err=True)


def _timestamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")

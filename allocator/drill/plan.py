"""One drill run from request to document: which cluster, which scenarios, what comes out."""

from __future__ import annotations

import json
import random
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from allocator import config as config_mod
from allocator.core.errors import UsageError
from allocator.drill import resources, schedule, upgrade
from allocator.drill import scenarios as scenarios_mod
from allocator.drill.links import Links
from allocator.drill.observe import DrillError, cluster_pids, left_running, running_pids
from allocator.drill.output import document, verdict
from allocator.drill.results import ScenarioResult
from allocator.drill.runner import Drill, Sources
from allocator.drill.scenarios import (
    LINKS,
    MIXED,
    ROLLING_UPGRADE,
    SCENARIOS,
    STANDBY,
    Target,
    refusal,
)
from allocator.local import nodes as nodes_mod
from allocator.local.cluster import LocalCluster
from allocator.local.info import ClusterInfo
from allocator.local.record import DEFAULT_ZK_SERVERS
from allocator.zookeeper import client as zkclient
from allocator.zookeeper.election import read_contenders

LINKS_DIR: Final = "drill-links"
SHIM: Final = (sys.executable, "-m", "allocator.drill.shim")
SOAK_ROUNDS: Final = 1_000_000
"""A soak's schedule length: never reached, the duration ends it."""
RESOURCE_INTERVAL_S: Final = 10.0

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Request:
    """What ``allocator drill`` was asked: the scenario, the target cluster, a soak's duration.

    ``mixed`` draws its schedule from ``seed`` (a random one when None, always recorded); a
    soak (``duration_s``) runs a mixed schedule of the faults node processes survive
    (:data:`allocator.drill.schedule.SURVIVABLE`, so the same processes meet every fault and
    their growth can be judged) until the time is up, while
    :mod:`allocator.drill.resources` samples every node."""

    scenario: str
    rounds: int
    seed: int | None = None
    nodes: int = nodes_mod.DEFAULT_NODES
    zk_servers: int | None = None  # None: as recorded, else 3
    session_timeout_ms: int = nodes_mod.DEFAULT_SESSION_TIMEOUT_MS
    state_dir: Path = Path(".run/drill")
    against: Path | None = None
    config_path: Path | None = None
    database_url: str | None = None
    keep: bool = False
    duration_s: float | None = None
    from_release: str | None = None
    """The rolling upgrade's old release: a built release folder or a git revision."""


@dataclass
class Outcome:
    """A run's results, its document and the scenarios the target refused (and why)."""

    results: list[ScenarioResult] = field(default_factory=list)
    document: dict[str, Any] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    resources_ok: bool = True

    @property
    def ok(self) -> bool:
        """The verdict holds and the resources stayed in bound (on a soak, a node past the
        bound or any node not judged fails the run)."""
        verdict_ok = bool(self.document.get("verdict", {}).get("ok", False))
        return verdict_ok and self.resources_ok


def wanted(request: Request) -> list[str]:
    """The scenario names the request runs (mixed/soak: those its schedule draws from)."""
    if request.duration_s is not None or request.scenario in (MIXED, scenarios_mod.ALL):
        return list(SCENARIOS)
    return [request.scenario]


def run(request: Request, progress: Progress) -> Outcome:
    """Bring the target up (own cluster), run, judge, and stop what the drill started.

    Three targets. The drill's *own* cluster (``--state-dir``, created or reused, stopped at
    the end unless ``--keep``): every scenario; for one that needs links the nodes are
    restarted under :mod:`allocator.drill.shim` with proxies opened first (links a kept
    cluster's nodes were given end as each node restarts), and a standby is added when one
    needs it. A running local cluster (``--against``): never started, reconfigured or
    stopped; every scenario but those needing links (or a standby it lacks). A deployed
    cluster (``--config``): reached only through its documented surfaces (ZooKeeper, the
    admin step-down, the database), so only ``step-down``."""
    if request.against is not None and request.config_path is not None:
        raise UsageError("--against and --config name two clusters: give one")
    if request.duration_s is not None and request.config_path is not None:
        raise UsageError("a soak samples the nodes' processes: not with --config")
    if request.scenario == ROLLING_UPGRADE or request.from_release is not None:
        return _run_upgrade(request, progress)
    if request.config_path is not None:
        return _run_deployed(request, progress)
    if request.against is not None:
        return _run_against(request, progress)
    return _run_own(request, progress)


# -- targets ------------------------------------------------------------------------------------


def _needs(names: Sequence[str], target_capable: frozenset[str]) -> dict[str, str]:
    refused: dict[str, str] = {}
    for name in names:
        reason = refusal(SCENARIOS[name], target_capable)
        if reason is not None:
            refused[name] = reason
    return refused


def _run_own(request: Request, progress: Progress) -> Outcome:
    names = wanted(request)
    need = set().union(*(SCENARIOS[n].needs for n in names))
    cluster = LocalCluster(
        request.state_dir,
        request.zk_servers,
        nodes=request.nodes,
        session_timeout_ms=request.session_timeout_ms,
        pg_standby=STANDBY in need,
    )
    existed = cluster.exists()
    links: Links | None = None
    came_up = False
    servers = request.zk_servers or ("as recorded" if existed else DEFAULT_ZK_SERVERS)
    progress(
        f"starting the cluster in {cluster.state_dir} (ZooKeeper servers: {servers}, "
        f"{request.nodes} nodes, session timeout {request.session_timeout_ms} ms)"
    )
    try:
        if LINKS in need:
            info = cluster.up(migrate=True, nodes=0)  # servers first: the proxies need them
            links = Links(
                cluster.state_dir / LINKS_DIR,
                [nodes_mod.node_name(i) for i in range(1, request.nodes + 1)],
                [s.client_port for s in info.zk_servers],
                [s.port for s in info.pg_servers] or [info.postgres.port],
            )
            links.open()
            command = [*SHIM, "--links", str(links.links_dir), "--", *_base_command(cluster)]
            cluster = LocalCluster(
                request.state_dir,
                nodes=request.nodes,
                session_timeout_ms=request.session_timeout_ms,
                node_command=command,
                pg_standby=STANDBY in need,
            )
        info = cluster.up(migrate=True, nodes=request.nodes)
        came_up = True
        target = _local_target(cluster, info, links, request)
        cluster_json = {"state_dir": str(cluster.state_dir)}
        outcome = _drive(request, target, _local_sources(cluster, info), progress, cluster_json)
    finally:
        stop = not request.keep and (came_up or not existed)
        if stop:
            progress("stopping the cluster")
            cluster.down()
        if links is not None:
            links.close()
    pids = outcome.document["cluster"]["pids"]
    outcome.document["cluster"].update(
        stopped=stop, left_running=left_running(pids) if stop else []
    )
    return outcome


def upgrade_refusal(request: Request) -> str | None:
    """Why the request cannot run the rolling upgrade (None: it can). It needs the old
    release, and a cluster of its own it starts, upgrades and stops."""
    if request.scenario != ROLLING_UPGRADE:
        return f"--from-release is for --scenario {ROLLING_UPGRADE} only"
    if request.from_release is None:
        return (
            f"--scenario {ROLLING_UPGRADE} needs --from-release (a release folder with "
            ".venv/bin/allocator, or a git revision scripts/build-release.sh builds)"
        )
    if request.against is not None or request.config_path is not None:
        return f"{ROLLING_UPGRADE} runs on a cluster of its own: not with --against or --config"
    if request.duration_s is not None or request.keep:
        return f"{ROLLING_UPGRADE} is one run that stops what it started: no --duration or --keep"
    return None


def _run_upgrade(request: Request, progress: Progress) -> Outcome:
    reason = upgrade_refusal(request)
    if reason is not None:
        raise UsageError(reason)
    assert request.from_release is not None
    done = upgrade.run(
        upgrade.Request(
            from_release=request.from_release,
            state_dir=request.state_dir,
            session_timeout_ms=request.session_timeout_ms,
            zk_servers=request.zk_servers,
            seed=request.seed,
        ),
        progress,
    )
    return Outcome(results=[done.scenario], document=done.document)


def _run_against(request: Request, progress: Progress) -> Outcome:
    assert request.against is not None
    cluster = LocalCluster(request.against)
    if not cluster.exists():
        raise UsageError(f"no cluster in {cluster.state_dir} (`allocator local up` makes one)")
    info = cluster.status()
    if not info.running or not info.nodes:
        raise UsageError(f"the cluster in {cluster.state_dir} is not running with nodes")
    target = _local_target(cluster, info, None, request)
    cluster_json = {"state_dir": str(cluster.state_dir), "stopped": False, "left_running": []}
    return _drive(request, target, _local_sources(cluster, info), progress, cluster_json)


def _run_deployed(request: Request, progress: Progress) -> Outcome:
    assert request.config_path is not None
    config = config_mod.load_config(request.config_path)
    url = request.database_url or config.postgres.url.get_secret_value()
    zk = config.zookeeper
    names, admin_urls = _deployed_nodes(config)
    target = Target(
        names=names,
        admin_urls=admin_urls,
        admin_token=config.node.admin_token.get_secret_value(),
        session_timeout_ms=zk.session_timeout_ms,
        zk_hosts=zk.hosts,
        rng=_rng(request),
    )
    sources = Sources(
        database_url=url,
        consumer_url=url,
        zk_auth=zk.auth.get_secret_value(),
        pids=_election_pids,
        election_path=zk.election_path,
    )
    return _drive(
        request, target, sources, progress, cluster_json={"config": str(request.config_path)}
    )


def _deployed_nodes(config: config_mod.Config) -> tuple[list[str], dict[str, str]]:
    """The contenders now in the election and their admin URLs (from their znodes)."""
    client = zkclient.client(config)
    try:
        client.start(timeout=config.zookeeper.session_timeout_ms / 1000)
        contenders = read_contenders(client, config.zookeeper.election_path)
    finally:
        client.stop()
        client.close()
    if not contenders:
        raise DrillError(f"nobody is in the election at {config.zookeeper.hosts}")
    names = [c.identity.name for c in contenders]
    urls = {c.identity.name: _admin_url(c.identity.admin_address) for c in contenders}
    return names, urls


def _admin_url(address: str) -> str:
    return address if address.startswith("http") else f"http://{address}"


def _election_pids(contenders: Sequence[Any]) -> dict[str, int]:
    return {c.identity.name: c.identity.pid for c in contenders}


def _base_command(cluster: LocalCluster) -> list[str]:
    """The nodes' recorded command without a drill shim around it (else the default)."""
    try:
        raw = json.loads(cluster.state_file.read_text())
    except (OSError, ValueError):
        raw = {}
    command = raw.get("node_command") if isinstance(raw, dict) else None
    if not isinstance(command, list) or not command:
        return nodes_mod.default_command()
    argv = [str(a) for a in command]
    if argv[: len(SHIM)] == list(SHIM) and "--" in argv:
        return argv[argv.index("--") + 1 :]
    return argv


def _local_target(
    cluster: LocalCluster, info: ClusterInfo, links: Links | None, request: Request
) -> Target:
    names = [n.name for n in info.nodes]
    return Target(
        names=names,
        admin_urls={n.name: n.admin_url for n in info.nodes},
        admin_token=info.admin_token,
        session_timeout_ms=info.session_timeout_ms,
        zk_hosts=info.node_zk_hosts,
        local=cluster,
        links=links,
        node_state_dirs={n: nodes_mod.node_state_dir(cluster.state_dir, n) for n in names},
        zk_server_ids=[s.id for s in info.zk_servers],
        has_standby=any(getattr(s, "role", "") == "standby" for s in info.pg_servers),
        rng=_rng(request),
    )


def _local_sources(cluster: LocalCluster, info: ClusterInfo) -> Sources:
    state_dir = cluster.state_dir
    names = [n.name for n in info.nodes]
    return Sources(
        database_url=info.database_url,
        consumer_url=info.consumer_database_url,
        zk_auth=info.zk_auth,
        pids=lambda _contenders: running_pids(state_dir, names),
        node_logs=tuple(n.log for n in info.nodes),
        known_pids=tuple(cluster_pids(info)),
    )


def _rng(request: Request) -> random.Random:
    return random.Random(request.seed)  # noqa: S311 (fault choices, not secrets)


# -- the run --------------------------------------------------------------------------------


def _drive(
    request: Request,
    target: Target,
    sources: Sources,
    progress: Progress,
    cluster_json: dict[str, Any],
) -> Outcome:
    # A scenario the target cannot run is refused before anything runs: asked for by name,
    # the run fails with the reason (UsageError); within all or mixed it is left out, and
    # the document's "refused" says why.
    outcome = Outcome()
    names = wanted(request)
    outcome.refused = _needs(names, target.capabilities())
    single = request.duration_s is None and request.scenario not in (MIXED, scenarios_mod.ALL)
    if single and outcome.refused:
        raise UsageError(outcome.refused[request.scenario])
    runnable = [n for n in names if n not in outcome.refused]
    for reason in outcome.refused.values():
        progress(f"refused: {reason}")
    seed = request.seed if request.seed is not None else secrets.randbelow(2**31)
    started_at = datetime.now(UTC)
    drill = Drill(target, sources, progress=progress)
    sampler: resources.Sampler | None = None
    log = resources.ResourceLog()
    try:
        drill.open()
        if request.duration_s is not None and target.local is not None:
            local = target.local
            sampler = resources.Sampler(
                lambda: running_pids(local.state_dir, target.names),
                RESOURCE_INTERVAL_S,
                log,
                origin_s=drill.timeline.started,
            ).start()
        outcome.results = _scenarios(drill, request, runnable, seed, progress)
    finally:
        if sampler is not None:
            sampler.stop()
        drill.close()
    end_s = drill.timeline.now_s()
    resources_json: dict[str, Any] | None = None
    if sampler is not None:
        resources_json = resources.judge(log)
        # A soak that judged nobody (too short, or every node restarted) proves nothing.
        unjudged = list(resources_json.get("not_judged", []))
        outcome.resources_ok = bool(resources_json.get("ok", True)) and not unjudged
    run_json = {
        "started_at": started_at.isoformat(),
        "duration_s": round(end_s, 1),
        "seed": seed,
        "session_timeout_ms": target.session_timeout_ms,
        "nodes": target.names,
        "refused": outcome.refused,
    }
    pids = sorted(drill.pids)
    cluster_json = {**cluster_json, "pids": pids}
    outcome.document = document(
        outcome.results,
        run=run_json,
        verdict=verdict(
            outcome.results, drill.timeline.leaderless_s(), drill.timeline.worst_runway()
        ),
        timeline=drill.timeline.to_json(end_s),
        cluster=cluster_json,
        resources=resources_json,
    )
    return outcome


def _scenarios(
    drill: Drill, request: Request, runnable: list[str], seed: int, progress: Progress
) -> list[ScenarioResult]:
    if request.duration_s is not None:
        until = time.monotonic() + request.duration_s
        plan = schedule.soak(seed, SOAK_ROUNDS, runnable)
        progress(
            f"soak: mixed schedule of the faults nodes survive (seed {seed}) for "
            f"{request.duration_s:.0f} s"
        )
        return [drill.run_schedule(plan, seed=seed, until=until)]
    if request.scenario == MIXED:
        plan = schedule.mixed(seed, request.rounds, runnable)
        progress(f"mixed: {request.rounds} rounds (seed {seed})")
        return [drill.run_schedule(plan, seed=seed)]
    results = []
    for name in runnable:
        progress(f"{name}: {request.rounds} rounds")
        results.append(drill.run(name, request.rounds))
    return results

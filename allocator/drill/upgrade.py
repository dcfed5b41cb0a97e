"""``allocator drill --scenario rolling-upgrade``: a rolling upgrade from an earlier release,
measured and judged (docs/upgrades.md, docs/drills.md).

A cluster of its own, started without schema; the old release's own ``allocator migrate``
makes its schema; three nodes of the old release run outside the supervisor
(:class:`~allocator.drill.node_process.NodeProcess`) with the drill's consumers claiming.
Then the upgrade in its order, one step a round: this checkout's ``allocator migrate`` under
the old nodes, each follower replaced by a node of this checkout, the leader last after a
step-down. :mod:`allocator.drill.upgrade_judge` judges each step; the checker judges the run.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from allocator.config import process_environment
from allocator.core.errors import DatabaseError
from allocator.core.layout import Layout
from allocator.core.verify import Violation
from allocator.drill import consumers as consumers_mod
from allocator.drill import release, upgrade_judge
from allocator.drill.consumers import Consumers, StuckConsumersError
from allocator.drill.node_process import NodeProcess
from allocator.drill.observe import (
    DrillError,
    FenceReader,
    Leader,
    LogCounter,
    cluster_pids,
    left_running,
    newer_epoch,
    request_step_down,
    wait_until,
)
from allocator.drill.output import document, verdict
from allocator.drill.results import RoundResult, ScenarioResult
from allocator.drill.scenarios import ROLLING_UPGRADE
from allocator.drill.timeline import Timeline
from allocator.drill.upgrade_judge import MIGRATE, REPLACE_FOLLOWER, REPLACE_LEADER, Swap
from allocator.local import nodes as nodes_mod
from allocator.local.cluster import LocalCluster
from allocator.local.info import ClusterInfo
from allocator.local.tcp_ports import pick_free_ports
from allocator.postgres import ledger as verify_db
from allocator.postgres.migrate import current_revision
from allocator.postgres.store import DEFAULT_MAX_CLOCK_AHEAD_MS

NODES: Final = 3
STATE_SUBDIR: Final = "rolling-upgrade"
"""The upgrade's cluster lives in this folder of ``--state-dir``, made anew each run."""
CLAIMS_PER_STEP: Final = 50
"""Blocks the consumers must receive after each step before the next one starts."""
CONSUMERS: Final = 2
CLAIM_INTERVAL_S: Final = 0.02
WAIT_S: Final = 60.0
POLL_S: Final = 0.05
HANDOVER_POLL_S: Final = 0.01
COMMAND_TIMEOUT_S: Final = 120

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Request:
    """What the rolling upgrade was asked: the old release (folder or git revision), where its
    cluster lives, the nodes' session timeout and ZooKeeper servers, the schedule's seed."""

    from_release: str
    state_dir: Path
    session_timeout_ms: int = nodes_mod.DEFAULT_SESSION_TIMEOUT_MS
    zk_servers: int | None = None
    seed: int | None = None


@dataclass
class Result:
    """The scenario and its document, as :class:`allocator.drill.plan.Outcome` wants them."""

    scenario: ScenarioResult
    document: dict[str, Any] = field(default_factory=dict)


def run(request: Request, progress: Progress) -> Result:
    """Build or find the release, run the upgrade on a new cluster, stop everything it
    started (the cluster's data and logs stay in ``<state-dir>/rolling-upgrade``)."""
    release_dir = release.resolve(request.from_release)
    state_dir = request.state_dir / STATE_SUBDIR
    cluster = LocalCluster(
        state_dir, request.zk_servers, nodes=0, session_timeout_ms=request.session_timeout_ms
    )
    if cluster.exists():  # a previous run's: the upgrade starts from an empty database
        cluster.down(purge=True)
    progress(f"rolling upgrade from {release_dir} in {state_dir}")
    upgrade: _Upgrade | None = None
    try:
        info = cluster.up(migrate=False, nodes=0)
        _command(
            release.allocator_command(release_dir, "migrate", "--database-url", info.database_url),
            release.OLD_CODE_ENV,
        )
        info = cluster.up(migrate=False, nodes=0)  # the login roles, now their groups exist
        upgrade = _Upgrade(cluster, info, release_dir, request, progress)
        result = upgrade.run()
    finally:
        if upgrade is not None:
            upgrade.stop_nodes()
        progress("stopping the cluster")
        cluster.down()
    pids = result.document["cluster"]["pids"]
    result.document["cluster"].update(stopped=True, left_running=left_running(pids))
    return result


def _command(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """Run an ``allocator`` command to its end; its stdout, or DrillError with its stderr."""
    done = subprocess.run(
        list(argv),
        env={**nodes_mod.base_env(process_environment()), **env},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise DrillError(f"{' '.join(argv[-4:])} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


class _Upgrade:
    """One rolling upgrade on a cluster that has the old schema and no nodes yet."""

    def __init__(
        self,
        cluster: LocalCluster,
        info: ClusterInfo,
        release_dir: Path,
        request: Request,
        progress: Progress,
    ) -> None:
        self._cluster = cluster
        self._info = info
        self._release = release_dir
        self._request = request
        self._progress = progress
        self._old_names = [f"old-{i}" for i in range(1, NODES + 1)]
        new_names = [f"new-{i}" for i in range(1, NODES + 1)]
        ports = pick_free_ports(2 * NODES)
        self._ports = dict(zip([*self._old_names, *new_names], ports, strict=True))
        self._urls = {name: nodes_mod.admin_url(port) for name, port in self._ports.items()}
        self._nodes: dict[str, NodeProcess] = {}
        self._fence = FenceReader(info.database_url)
        self._consumers = Consumers(
            info.consumer_database_url,
            consumers_mod.named("drill-consumer", CONSUMERS),
            pause_s=CLAIM_INTERVAL_S,
        )
        self._timeline = Timeline(
            info.database_url, self._urls, lambda: self._consumers.totals().claims
        )
        state_dir = cluster.state_dir
        self._logs = LogCounter(nodes_mod.log_path(state_dir, n) for n in self._ports)
        self._pids: set[int] = set()
        self._swaps: list[Swap] = []

    # -- nodes ------------------------------------------------------------------------------

    def _start(self, name: str, *, old: bool) -> NodeProcess:
        info = self._info
        env = nodes_mod.node_env(
            name=name,
            zk_hosts=info.node_zk_hosts,
            postgres_url=info.node_database_url,
            admin_port=self._ports[name],
            admin_token=info.admin_token,
            zk_auth=info.zk_auth,
            session_timeout_ms=info.session_timeout_ms,
            state_dir=nodes_mod.node_state_dir(self._cluster.state_dir, name),
            extra=release.OLD_CODE_ENV if old else {},
        )
        command = (
            release.allocator_command(self._release, "run") if old else nodes_mod.default_command()
        )
        log_path = nodes_mod.log_path(self._cluster.state_dir, name)
        node = NodeProcess(name, command, env, log_path, self._cluster.state_dir)
        self._nodes[name] = node
        self._pids.add(node.pid)
        return node

    def stop_nodes(self) -> None:
        """Stop every node the upgrade started (always called)."""
        for node in self._nodes.values():
            node.stop()

    def _wait_role(self, node: NodeProcess, role: str) -> None:
        def check() -> tuple[bool | None, str]:
            if node.exit_code is not None:
                raise DrillError(f"{node.name} exited {node.exit_code} (see {node.log_path})")
            now = node.role()
            return (True if now == role else None), f"{node.name} is {now}"

        wait_until(check, WAIT_S, POLL_S, f"{node.name} to be {role}")

    def _leader(self) -> Leader:
        def check() -> tuple[Leader | None, str]:
            state = self._fence.read()
            node = self._nodes.get(state.holder or "")
            if node is None or node.exit_code is not None or node.role() != "leader":
                return None, f"fence epoch {state.epoch} held by {state.holder}"
            return Leader(node.name, node.pid, state.epoch, node.admin_url), ""

        leader: Leader = wait_until(check, WAIT_S, POLL_S, "a leader serving")
        return leader

    def _wait_claims(self, what: str) -> None:
        target = self._consumers.record_count() + CLAIMS_PER_STEP
        wait_until(
            lambda: (True if self._consumers.record_count() >= target else None, "too few"),
            WAIT_S,
            POLL_S,
            f"{CLAIMS_PER_STEP} claims {what}",
        )

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> Result:
        started_at = datetime.now(UTC)
        result = ScenarioResult(
            ROLLING_UPGRADE,
            self._info.session_timeout_ms,
            NODES,
            len(self._info.zk_servers),
        )
        schema_before = current_revision(self._info.database_url)
        for name in self._old_names:
            self._start(name, old=True)
        leader = self._leader()
        for name, node in self._nodes.items():
            self._wait_role(node, "leader" if name == leader.name else "follower")
        self._progress(f"old release: {leader.name} leads (epoch {leader.epoch})")
        self._logs.mark()
        self._consumers.start()
        self._timeline.start()
        began = time.monotonic()
        try:
            self._wait_claims("from the old release")
            result.rounds.append(self._step(1, MIGRATE, leader, self._migrate))
            followers = [n for n in self._old_names if n != leader.name]
            for index, name in enumerate(followers, start=1):
                replace = functools.partial(self._replace_follower, old_name=name, new=index)
                result.rounds.append(
                    self._step(len(result.rounds) + 1, REPLACE_FOLLOWER, leader, replace)
                )
            replace_leader = functools.partial(self._replace_leader, leader=leader)
            result.rounds.append(
                self._step(len(result.rounds) + 1, REPLACE_LEADER, leader, replace_leader)
            )
        finally:
            self._timeline.stop()
            try:
                self._consumers.stop()
            except StuckConsumersError as exc:
                self._progress(f"consumers stuck: {exc}")
        totals = self._consumers.totals()
        result.claims, result.claim_errors = totals.claims, totals.errors
        result.claim_error_kinds = totals.error_kinds
        result.claim_error_examples = totals.error_examples
        result.pool_empty = totals.pool_empty
        result.stale_writes_rejected = self._logs.count()
        result.violations = self._verdict()
        result.duration_s = time.monotonic() - began
        result.leaderless_s = self._timeline.leaderless_s()
        result.upgrade = upgrade_judge.summary(
            from_release=str(self._release),
            schema_before=schema_before,
            schema_after=current_revision(self._info.database_url),
            swaps=self._swaps,
            steps=result.rounds,
        )
        self._fence.close()
        return Result(result, self._document(result, started_at))

    def _step(
        self,
        number: int,
        step: str,
        leader: Leader,
        act: Callable[[RoundResult], None],
    ) -> RoundResult:
        """One step: ``act``, then claims must flow again; judged by
        :func:`~allocator.drill.upgrade_judge.step_error`."""
        outcome = RoundResult(number, faults=[step])
        outcome.leader, outcome.leader_pid, outcome.epoch = leader.name, leader.pid, leader.epoch
        before = self._consumers.totals()
        started = time.monotonic()
        mark = self._timeline.fault(step, number, started, None)
        try:
            act(outcome)
            self._wait_claims(f"after step {number} ({step})")
        except DrillError as exc:
            outcome.error = str(exc)
        outcome.ready_ms = round((time.monotonic() - started) * 1000, 1)
        during = self._consumers.totals().since(before)
        outcome.claims, outcome.claim_errors = during.claims, during.errors
        outcome.pool_empty = during.pool_empty
        outcome.error = upgrade_judge.step_error(outcome)
        mark.target, mark.handover_ms, mark.ok = outcome.target, outcome.handover_ms, outcome.ok
        mark.healed_s = self._timeline.now_s()
        self._progress(_step_line(outcome))
        return outcome

    def _migrate(self, outcome: RoundResult) -> None:
        """This checkout's ``allocator migrate`` under the old nodes: the leader keeps its term."""
        outcome.target = "schema"
        url = self._info.database_url
        _command([sys.executable, "-m", "allocator.cli", "migrate", "--database-url", url], {})
        self._kept(outcome)

    def _kept(self, outcome: RoundResult) -> None:
        state = self._fence.read()
        if (state.epoch, state.holder) != (outcome.epoch, outcome.leader):
            outcome.new_leader, outcome.new_epoch = state.holder, state.epoch
            raise DrillError(f"the leader changed: epoch {state.epoch} held by {state.holder}")

    def _swap(self, old_name: str, new_name: str, role: str) -> None:
        """Stop ``old_name`` (it must exit 0), start ``new_name`` of this checkout, wait until
        it follows."""
        started = time.monotonic()
        exit_code = self._nodes[old_name].stop()
        new = self._start(new_name, old=False)
        self._wait_role(new, "follower")
        self._swaps.append(Swap(old_name, new_name, role, time.monotonic() - started, exit_code))
        if exit_code != 0:
            raise DrillError(f"{old_name} exited {exit_code}, not 0, when stopped")

    def _replace_follower(self, outcome: RoundResult, *, old_name: str, new: int) -> None:
        """A follower replaced; the leader keeps its term throughout."""
        outcome.target = old_name
        self._swap(old_name, f"new-{new}", "follower")
        self._kept(outcome)

    def _replace_leader(self, outcome: RoundResult, *, leader: Leader) -> None:
        """Step-down (handover: from asking until the fence shows a newer epoch held by
        another node), then the old leader, a follower now, replaced like one."""
        outcome.target = leader.name
        asked = time.monotonic()
        request_step_down(leader.admin_url, self._info.admin_token)
        deadline = asked + WAIT_S
        while (seen := newer_epoch(self._fence, leader)) is None:
            if time.monotonic() >= deadline:
                raise DrillError(f"no new epoch within {WAIT_S:.0f} s of the step-down")
            time.sleep(HANDOVER_POLL_S)
        outcome.handover_ms = round((time.monotonic() - asked) * 1000, 1)
        outcome.new_leader, outcome.new_epoch = seen.holder, seen.epoch
        self._wait_role(self._nodes[leader.name], "follower")
        self._swap(leader.name, f"new-{NODES}", "leader")

    # -- the verdict ------------------------------------------------------------------------

    def _verdict(self) -> list[Violation]:
        """The checker over the consumers' records and the database's evidence."""
        records = self._consumers.records()
        try:
            evidence = verify_db.read_url(self._info.database_url)
        except DatabaseError as exc:
            raise DrillError(f"cannot judge the run: {exc}") from exc
        return verify_db.judge(
            records, evidence, layout=Layout(), max_clock_ahead_ms=DEFAULT_MAX_CLOCK_AHEAD_MS
        )

    def _document(self, result: ScenarioResult, started_at: datetime) -> dict[str, Any]:
        end_s = self._timeline.now_s()
        pids = sorted(self._pids | set(cluster_pids(self._info)))
        return document(
            [result],
            run={
                "started_at": started_at.isoformat(),
                "duration_s": round(end_s, 1),
                "seed": self._request.seed or 0,
                "session_timeout_ms": result.session_timeout_ms,
                "nodes": list(self._ports),
                "refused": {},
            },
            verdict=verdict([result], self._timeline.leaderless_s(), self._timeline.worst_runway()),
            timeline=self._timeline.to_json(end_s),
            cluster={"state_dir": str(self._cluster.state_dir), "pids": pids},
        )


def _step_line(outcome: RoundResult) -> str:
    head = f"{ROLLING_UPGRADE} step {outcome.round} ({outcome.faults[0]} {outcome.target})"
    if outcome.error is not None:
        return f"{head}: FAILED: {outcome.error}"
    if outcome.handover_ms is not None:
        return (
            f"{head}: {outcome.leader} (epoch {outcome.epoch}) -> {outcome.new_leader} "
            f"(epoch {outcome.new_epoch}) in {outcome.handover_ms:.1f} ms"
        )
    return f"{head}: {outcome.leader} (epoch {outcome.epoch}) kept the lead"

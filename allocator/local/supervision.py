"""The embedded cluster's nodes as the manager runs them: their specs, the supervisor
process that runs them, and the requests it carries out."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from allocator.config import process_environment
from allocator.core import logs
from allocator.core.errors import LocalClusterError, ServerStartError, UsageError
from allocator.local import nodes as nodes_mod
from allocator.local import postgres, processes, tcp_ports, zookeeper
from allocator.local.folder import StateFolder
from allocator.local.record import Proc, State, new_token, new_zk_auth
from allocator.local.stopping import nodes_stop_timeout_s, stop_supervisor

log = logs.get_logger(__name__)

APPLY_POLL_INTERVAL_S = 0.05


def start_nodes(
    folder: StateFolder,
    state: State,
    count: int | None,
    *,
    command: Sequence[str] | None,
    env: Mapping[str, str] | None,
    session_timeout_ms: int | None,
    timeout_s: float,
) -> None:
    """Bring the nodes to ``count`` (None: as recorded), all running, under a supervisor.

    The supervisor (:mod:`allocator.local.supervisor`) restarts any node that exits. Node
    settings (count, ``command``, extra ``env``, session timeout; None: as recorded) are
    recorded; other settings than the running ones restart the supervisor and its nodes
    with the new ones. Every node that was stopped on request starts again. Returns once the
    supervisor has started every node (not waiting for them to serve). The nodes' chroot
    ``/allocator`` is made first, with the cluster's ZooKeeper ACL.
    """
    if command is not None:
        state.node_command = list(command)
    if env is not None:
        state.node_env = dict(env)
    if session_timeout_ms is not None:
        state.session_timeout_ms = session_timeout_ms
    wanted = node_specs(folder.path, state, len(state.nodes) if count is None else count)
    supervising = state.supervisor.alive()
    if supervising and nodes_mod.specs_differ(state.nodes, wanted):
        log.info("nodes_reconfigured", state=folder.path, note="restarting the supervisor")
        stop_supervisor(folder, state)
        supervising = False
    state.nodes = wanted
    # The nodes' chroot exists whatever the count, so node_zk_hosts works for nodes
    # started by hand (``allocator run``) next to a cluster brought up with none. A
    # running supervisor's nodes made it already.
    if not state.zk_auth:
        state.zk_auth = new_zk_auth()
    if not supervising:
        zookeeper.ensure_chroot(
            state.zk_hosts(), nodes_mod.DEFAULT_CHROOT, state.zk_auth, timeout_s
        )
    if not wanted:
        folder.save(state)
        return
    if supervising:
        request(folder, state, timeout_s)
        return
    # Nodes a killed supervisor left behind would hold the admin ports (and a name).
    nodes_mod.stop_recorded(folder.path, nodes_stop_timeout_s(state))
    for spec in wanted:
        tcp_ports.ensure_free(spec.admin_port, f"{spec.name} admin port")
    state.node_generation += 1
    folder.save(state)
    daemon = processes.start(
        nodes_mod.supervisor_command(folder.path),
        log_path=nodes_mod.supervisor_log_path(folder.path),
        env=nodes_mod.base_env(process_environment()),
        cwd=folder.path,
    )
    state.supervisor = Proc(daemon.pid, list(daemon.argv))
    folder.save(state)
    log.info("supervisor_started", pid=daemon.pid, nodes=len(wanted))
    try:
        wait_applied(folder, state, timeout_s)
    except BaseException:
        with contextlib.suppress(Exception):
            stop_supervisor(folder, state)
        raise


def node_specs(state_dir: Path, state: State, count: int) -> list[nodes_mod.NodeSpec]:
    """Specs of ``node-1``… ``node-<count>``, all to run; recorded admin ports are kept."""
    timeout_ms = state.session_timeout_ms or nodes_mod.DEFAULT_SESSION_TIMEOUT_MS
    bounds = zookeeper.limits(state.tick_ms)
    if count and not bounds["minSessionTimeout"] <= timeout_ms <= bounds["maxSessionTimeout"]:
        raise UsageError(
            f"a session timeout of {timeout_ms} ms is outside what this cluster's ZooKeeper "
            f"grants ({bounds['minSessionTimeout']}..{bounds['maxSessionTimeout']} ms at a "
            f"{state.tick_ms} ms tick)"
        )
    if count and not state.admin_token:
        state.admin_token = new_token()
    recorded = {spec.name: spec.admin_port for spec in state.nodes}
    names = [nodes_mod.node_name(i) for i in range(1, count + 1)]
    fresh = iter(
        tcp_ports.pick_free_ports_except(
            sum(n not in recorded for n in names), exclude=state.ports_in_use()
        )
    )
    argv = state.node_command or nodes_mod.default_command()
    zk_hosts = state.zk_hosts() + nodes_mod.DEFAULT_CHROOT
    db_url = nodes_mod.login_url(nodes_mod.NODE_LOGIN_ROLE, state.pg_ports(), postgres.DATABASE)
    specs = []
    for name in names:
        port = recorded[name] if name in recorded else next(fresh)
        env = nodes_mod.node_env(
            name=name,
            zk_hosts=zk_hosts,
            postgres_url=db_url,
            admin_port=port,
            admin_token=state.admin_token,
            zk_auth=state.zk_auth,
            session_timeout_ms=timeout_ms,
            state_dir=nodes_mod.node_state_dir(state_dir, name),
            extra=state.node_env,
        )
        specs.append(nodes_mod.NodeSpec(name, port, list(argv), env))
    return specs


def request(folder: StateFolder, state: State, timeout_s: float) -> None:
    """Publish the changed desired states and wait until the supervisor carried them out."""
    state.node_generation += 1
    folder.save(state)
    wait_applied(folder, state, timeout_s)


def wait_applied(folder: StateFolder, state: State, timeout_s: float) -> nodes_mod.Runtime:
    """Wait until the supervisor has applied the recorded node generation."""
    sup = state.supervisor
    deadline = time.monotonic() + timeout_s
    log_path = nodes_mod.supervisor_log_path(folder.path)
    while True:
        runtime = nodes_mod.read_runtime(folder.path)
        if (
            runtime is not None
            and runtime.supervisor_pid == sup.pid
            and runtime.applied_generation >= state.node_generation
        ):
            return runtime
        if not sup.alive():
            raise ServerStartError(
                f"the node supervisor (pid {sup.pid}) exited; last lines of {log_path}:\n"
                + processes.tail(log_path)
            )
        if time.monotonic() >= deadline:
            raise LocalClusterError(
                f"the node supervisor (pid {sup.pid}) did not carry out the request within "
                f"{timeout_s:.0f} s; see {log_path}"
            )
        time.sleep(APPLY_POLL_INTERVAL_S)


def require_supervisor(folder: StateFolder, state: State) -> None:
    """Raise :class:`LocalClusterError` saying how to start the nodes if none supervises."""
    if not state.supervisor.alive():
        raise LocalClusterError(
            f"the nodes of {folder.path} are not supervised (cluster down, or the "
            f"supervisor was killed): `allocator local up --state-dir {folder.path}` "
            "starts them"
        )


def find_spec(state: State, name: str) -> nodes_mod.NodeSpec:
    """The spec of node ``name``, or :class:`UsageError` naming the nodes."""
    for spec in state.nodes:
        if spec.name == name:
            return spec
    names = ", ".join(spec.name for spec in state.nodes) or "none"
    raise UsageError(f"no node {name!r} in this cluster (nodes: {names})")


def send_signal(folder: StateFolder, name: str, sig: signal.Signals | str) -> int:
    """Send ``sig`` (SIGSTOP, SIGCONT, SIGKILL or SIGTERM) to node ``name``; its pid.

    Only reads the record (no lock).
    """
    try:
        signum = nodes_mod.signal_by_name(sig) if isinstance(sig, str) else sig
    except KeyError:
        signum = None
    if signum is None or signum.name not in nodes_mod.DRILL_SIGNALS:
        raise UsageError(f"node signals are {', '.join(nodes_mod.DRILL_SIGNALS)}, not {sig}")
    find_spec(folder.require(), name)
    runtime = nodes_mod.read_runtime(folder.path)
    record = runtime.node(name) if runtime is not None else None
    if record is None or record.pid is None or not record.alive():
        raise LocalClusterError(f"{name} is not running (see `allocator local status`)")
    if not processes.send_signal(record.pid, record.argv, signum, record.started):
        raise LocalClusterError(f"{name} (pid {record.pid}) exited before {signum.name}")
    log.info("node_signalled", name=name, pid=record.pid, signal=signum.name)
    return record.pid

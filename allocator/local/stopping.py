"""Stopping an embedded cluster's processes by pid: all of them (``down``), the node
supervisor, or what a failed start began."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from allocator.core import logs
from allocator.core.errors import LocalClusterError
from allocator.local import nodes as nodes_mod
from allocator.local import postgres, processes
from allocator.local.folder import StateFolder
from allocator.local.record import PRIMARY, PgRecord, State

log = logs.get_logger(__name__)

ZK_STOP_TIMEOUT_S = 10.0
# On top of the nodes' stop timeout: the supervisor's SIGKILL wait, then its own exit.
SUPERVISOR_STOP_MARGIN_S = nodes_mod.KILL_TIMEOUT_S + 5.0
ROLLBACK_STOP_TIMEOUT_S = 5.0


def stop_everything(folder: StateFolder, state: State) -> None:
    """Stop every recorded process by pid; harmless when nothing runs.

    The supervisor first (it stops its nodes: SIGTERM, SIGKILL after their shutdown timeout
    + 2 s, 12 s by default), then any node still alive that ``nodes.json`` lists (the
    supervisor was killed), then PostgreSQL (fast shutdown, the primary first), then
    ZooKeeper (SIGTERM, all at once), SIGKILL after a timeout. A pid is forgotten only once
    its process is confirmed gone: what could not be stopped (no permission, survived
    SIGKILL) stays recorded and this raises after trying everything else, so a later
    ``down`` retries it.
    """
    failures: list[str] = []
    first: Exception | None = None

    def attempt(what: str, action: Callable[[], object]) -> None:
        nonlocal first
        try:
            action()
        except Exception as exc:
            log.exception("stop_failed", what=what)
            failures.append(f"{what}: {exc}")
            first = first or exc

    attempt("the node supervisor", lambda: stop_supervisor(folder, state))
    # Whatever a killed supervisor left behind (or a failed stop above).
    attempt(
        "nodes",
        lambda: nodes_mod.stop_recorded(folder.path, nodes_stop_timeout_s(state)),
    )
    # The primary first: its fast shutdown sends the standby all of its WAL.
    pg_servers = sorted(state.pg_servers(), key=lambda r: r.role != PRIMARY)
    for server in pg_servers:
        attempt(
            f"PostgreSQL {server.server} ({server.role})" if len(pg_servers) > 1 else "PostgreSQL",
            lambda s=server: postgres.stop(s.proc.pid, s.proc.argv, "fast"),  # type: ignore[misc]
        )
    zk_targets: list[processes.Target] = [
        (r.proc.pid, r.proc.argv) for r in state.zk if r.proc.pid is not None
    ]
    attempt("ZooKeeper", lambda: processes.stop_all(zk_targets, timeout_s=ZK_STOP_TIMEOUT_S))
    # Forget only the pids whose process is confirmed gone: the others stay recorded so
    # that a later `down` retries them (nodes.json keeps the nodes' pids the same way).
    for proc in (state.supervisor, *(s.proc for s in pg_servers), *(r.proc for r in state.zk)):
        proc.forget_if_gone()
    folder.save(state)
    if failures:
        raise LocalClusterError(
            "could not stop " + "; ".join(failures) + " (still recorded: `allocator local "
            f"down --state-dir {folder.path}` retries)"
        ) from first


def stop_supervisor(folder: StateFolder, state: State) -> None:
    """SIGTERM the supervisor (it stops its nodes); SIGKILL it and its nodes if it hangs."""
    sup = state.supervisor
    processes.stop(sup.pid, sup.argv, timeout_s=nodes_stop_timeout_s(state))
    sup.forget_if_gone()
    folder.save(state)


def nodes_stop_timeout_s(state: State) -> float:
    """Long enough for the supervisor to stop every node (and SIGKILL the stubborn)."""
    longest = max((s.stop_timeout_s for s in state.nodes), default=nodes_mod.STOP_TIMEOUT_S)
    return longest + SUPERVISOR_STOP_MARGIN_S


def rollback(
    folder: StateFolder, state: State, *, zk_ids: Sequence[int], pg: Sequence[PgRecord]
) -> None:
    """Stop what a failed start began (best effort; the original error is what matters).

    So a failing server start leaves nothing half-running behind.
    """
    try:
        for server in pg:
            processes.stop(
                server.proc.pid,
                server.proc.argv,
                sig=postgres.stop_signal("immediate"),
                timeout_s=ROLLBACK_STOP_TIMEOUT_S,
            )
        records = [r for r in state.zk if r.server.id in zk_ids]
        processes.stop_all(
            [(r.proc.pid, r.proc.argv) for r in records if r.proc.pid is not None],
            timeout_s=ROLLBACK_STOP_TIMEOUT_S,
        )
    except Exception:
        log.exception("rollback_failed", state=folder.path)
    finally:
        for server in state.pg_servers():
            server.proc.forget_if_gone()
        for record in state.zk:
            record.proc.forget_if_gone()
        folder.save(state)

"""Allocator nodes of the embedded cluster: what each one runs, and what its supervisor reports.

Two files, one writer each, both replaced atomically: ``cluster.json`` (the manager) holds each
node's :class:`NodeSpec` and ``node_generation``; ``nodes/nodes.json`` (:class:`Runtime`, the
supervisor only) holds what runs. The layout on disk is deploy/local/README.md's.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from allocator.core import logs
from allocator.local import postgres, processes
from allocator.local.tcp_ports import LOOPBACK

log = logs.get_logger(__name__)

NODES_DIR = "nodes"
RUNTIME_FILE = "nodes.json"
NODE_STATE_DIR = "state"
SUPERVISOR_LOG = "supervisor.log"
SUPERVISOR_LOCK = "supervisor.lock"
RUNTIME_VERSION = 1
DEFAULT_NODES = 3
DEFAULT_SESSION_TIMEOUT_MS = 4000
DEFAULT_CHROOT = "/allocator"
NODE_LOGIN_ROLE = "allocator_node_login"
CONSUMER_LOGIN_ROLE = "allocator_app"
SHUTDOWN_TIMEOUT_ENV = "ALLOCATOR_NODE_SHUTDOWN_TIMEOUT_S"
DEFAULT_SHUTDOWN_TIMEOUT_S = 10.0  # the node's own default (node.shutdown_timeout_s)
STOP_GRACE_S = 2.0  # SIGKILL only after the node's own shutdown deadline has passed
STOP_TIMEOUT_S = DEFAULT_SHUTDOWN_TIMEOUT_S + STOP_GRACE_S
KILL_TIMEOUT_S = 5.0
ENV_PREFIX = "ALLOCATOR_"
STOP_SIGNALS = ("SIGTERM", "SIGKILL")
# Signals `allocator local node-signal` sends (chaos drills).
DRILL_SIGNALS = ("SIGSTOP", "SIGCONT", "SIGKILL", "SIGTERM")

# Node states as the supervisor records them; status adds "paused" (SIGSTOPped), "down"
# (no supervisor, process gone) and "orphaned" (no supervisor, process still alive).
RUNNING = "running"
RESTARTING = "restarting"  # exited on its own; restarts after the backoff
STOPPING = "stopping"  # asked to exit (node-stop, or the supervisor is stopping)
STOPPED = "stopped"  # not running, and not to be restarted
PAUSED = "paused"
DOWN = "down"
ORPHANED = "orphaned"


def default_command() -> list[str]:
    """``allocator run`` on the interpreter running this code."""
    return [sys.executable, "-m", "allocator.cli", "run"]


def node_name(index: int) -> str:
    """``node-<index>`` (1-based)."""
    return f"node-{index}"


def nodes_dir(state_dir: Path) -> Path:
    """``<state>/nodes``."""
    return state_dir / NODES_DIR


def log_path(state_dir: Path, name: str) -> Path:
    """A node's log file."""
    return nodes_dir(state_dir) / f"{name}.log"


def node_state_dir(state_dir: Path, name: str) -> Path:
    """``<state>/nodes/state/<name>``: the node's ``node.state_dir`` (its session file)."""
    return nodes_dir(state_dir) / NODE_STATE_DIR / name


def runtime_path(state_dir: Path) -> Path:
    """``<state>/nodes/nodes.json``, written by the supervisor only."""
    return nodes_dir(state_dir) / RUNTIME_FILE


def supervisor_log_path(state_dir: Path) -> Path:
    """The supervisor's log file."""
    return nodes_dir(state_dir) / SUPERVISOR_LOG


def supervisor_command(state_dir: Path) -> list[str]:
    """The supervisor's argv; the state folder in it makes it unique per cluster."""
    return [sys.executable, "-m", "allocator.local.supervisor", "--state-dir", str(state_dir)]


def login_url(role: str, port: int | Sequence[int], database: str) -> str:
    """``postgresql://<role>@127.0.0.1:<port>/<database>`` (trust authentication); several
    ports make a multi-host URL that keeps to the writable server (see
    :func:`allocator.local.postgres.database_url`)."""
    return postgres.database_url(role, port, database)


def admin_url(port: int) -> str:
    """Where a node serves /metrics, /healthz, /readyz and /status."""
    return f"http://{LOOPBACK}:{port}"


def node_env(
    *,
    name: str,
    zk_hosts: str,
    postgres_url: str,
    admin_port: int,
    admin_token: str,
    zk_auth: str,
    session_timeout_ms: int,
    state_dir: Path,
    extra: Mapping[str, str],
) -> dict[str, str]:
    """The variables that configure one node (``extra`` wins); ``state_dir`` is the node's
    own (:func:`node_state_dir`), not the cluster's.

    A node is configured *only* through these: the ensemble plus the cluster's chroot
    (``/allocator``), the login role ``allocator_node_login``, the admin address on
    loopback, one random admin token per cluster, the cluster's random ZooKeeper digest
    identity (the nodes' znodes carry its ACL), the session timeout and the state folder.
    :func:`base_env` has dropped every other ``ALLOCATOR_*`` variable."""
    env = {
        "ALLOCATOR_ZOOKEEPER_HOSTS": zk_hosts,
        "ALLOCATOR_POSTGRES_URL": postgres_url,
        "ALLOCATOR_NODE_NAME": name,
        "ALLOCATOR_NODE_ADMIN_ADDRESS": f"{LOOPBACK}:{admin_port}",
        "ALLOCATOR_NODE_ADMIN_TOKEN": admin_token,
        "ALLOCATOR_ZOOKEEPER_AUTH": zk_auth,
        "ALLOCATOR_ZOOKEEPER_SESSION_TIMEOUT_MS": str(session_timeout_ms),
        "ALLOCATOR_NODE_STATE_DIR": str(state_dir),
    }
    env.update(extra)
    return env


def base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment the supervisor and the nodes start from: ``environ`` without any
    ``ALLOCATOR_*`` variable (a stray ``ALLOCATOR_CONFIG`` in a shell cannot reconfigure the
    nodes), unbuffered Python output (logs reach the log file at once) and
    the folder of this ``allocator`` package first on ``PYTHONPATH`` (``-m allocator…`` then
    imports this very code from any working folder)."""
    env = {key: value for key, value in environ.items() if not key.startswith(ENV_PREFIX)}
    env["PYTHONUNBUFFERED"] = "1"
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    return env


@dataclass
class NodeSpec:
    """What one node runs (``argv`` + ``env`` on top of :func:`base_env`), and whether it should.

    ``run`` and ``stop_signal`` are the desired state. A manager request: change the spec,
    bump ``node_generation``, save ``cluster.json``, wait until the supervisor's
    ``applied_generation`` reaches it."""

    name: str
    admin_port: int
    argv: list[str]
    env: dict[str, str]
    run: bool = True
    stop_signal: str = "SIGTERM"  # how the next requested stop is done: SIGTERM or SIGKILL

    @property
    def stop_timeout_s(self) -> float:
        """How long a stopping node gets before SIGKILL: its own ``node.shutdown_timeout_s``
        (from its environment, default 10 s) plus a grace of 2 s."""
        try:
            own = float(self.env.get(SHUTDOWN_TIMEOUT_ENV, DEFAULT_SHUTDOWN_TIMEOUT_S))
        except ValueError:
            own = DEFAULT_SHUTDOWN_TIMEOUT_S  # the node refuses to start with it anyway
        return max(own, 0.0) + STOP_GRACE_S

    def same_process(self, other: NodeSpec) -> bool:
        """True if both would start the same process (desired state aside)."""
        return (self.name, self.admin_port, self.argv, self.env) == (
            other.name,
            other.admin_port,
            other.argv,
            other.env,
        )

    def to_json(self) -> dict[str, Any]:
        """The spec as ``cluster.json`` holds it."""
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> NodeSpec:
        stop_signal = str(raw.get("stop_signal", "SIGTERM"))
        return cls(
            name=str(raw["name"]),
            admin_port=int(raw["admin_port"]),
            argv=[str(a) for a in raw["argv"]],
            env={str(k): str(v) for k, v in dict(raw.get("env", {})).items()},
            run=bool(raw.get("run", True)),
            stop_signal=stop_signal if stop_signal in STOP_SIGNALS else "SIGTERM",
        )


@dataclass
class NodeRecord:
    """One node as the supervisor last recorded it: pid, argv as ``/proc`` shows it and start
    time (every node runs the same argv, so only the three together tell a recycled pid from
    a node), state, restarts and the last exit code (negative: killed by that signal)."""

    name: str
    pid: int | None = None
    argv: list[str] = field(default_factory=list)
    started: int | None = None  # start time, clock ticks since boot (processes.start_time)
    started_at: str | None = None  # wall clock, ISO-8601 UTC
    state: str = STOPPED
    restarts: int = 0
    last_exit_code: int | None = None

    def alive(self) -> bool:
        """True if the recorded process still runs (pid, argv and start time all match)."""
        return processes.is_alive(self.pid, self.argv, self.started)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> NodeRecord:
        pid, started, code = raw.get("pid"), raw.get("started"), raw.get("last_exit_code")
        return cls(
            name=str(raw["name"]),
            pid=int(pid) if pid is not None else None,
            argv=[str(a) for a in raw.get("argv", [])],
            started=int(started) if started is not None else None,
            started_at=raw.get("started_at"),
            state=str(raw.get("state", STOPPED)),
            restarts=int(raw.get("restarts", 0)),
            last_exit_code=int(code) if code is not None else None,
        )


@dataclass
class Runtime:
    """``nodes.json``: the supervisor's report; ``applied_generation`` is the last
    ``node_generation`` of ``cluster.json`` it has carried out."""

    supervisor_pid: int
    applied_generation: int = 0
    nodes: list[NodeRecord] = field(default_factory=list)

    def node(self, name: str) -> NodeRecord | None:
        """Node ``name``'s record, or None."""
        return next((n for n in self.nodes if n.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": RUNTIME_VERSION,
            "supervisor_pid": self.supervisor_pid,
            "applied_generation": self.applied_generation,
            "nodes": [asdict(n) for n in self.nodes],
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Runtime:
        """The report read back; ValueError for another ``version``."""
        if raw.get("version") != RUNTIME_VERSION:
            raise ValueError(f"unknown nodes.json version {raw.get('version')!r}")
        return cls(
            supervisor_pid=int(raw["supervisor_pid"]),
            applied_generation=int(raw.get("applied_generation", 0)),
            nodes=[NodeRecord.from_json(n) for n in raw.get("nodes", [])],
        )


def read_runtime(state_dir: Path) -> Runtime | None:
    """The supervisor's last report; None if there is none (or it cannot be read)."""
    path = runtime_path(state_dir)
    try:
        return Runtime.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("nodes_record_unreadable", path=path, error=str(exc))
        return None


def write_runtime(state_dir: Path, runtime: Runtime) -> None:
    """Replace ``nodes.json`` atomically (the supervisor's job only)."""
    path = runtime_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(runtime.to_json(), indent=2) + "\n")
    tmp.replace(path)


def stop_recorded(state_dir: Path, timeout_s: float = STOP_TIMEOUT_S) -> list[int]:
    """Stop every node process ``nodes.json`` lists that still runs; return the pids hit.

    For when no supervisor is there to do it (it was killed): SIGTERM, SIGKILL after
    ``timeout_s``. Raises :class:`~allocator.core.errors.LocalClusterError` if one survives.
    """
    runtime = read_runtime(state_dir)
    if runtime is None:
        return []
    targets: list[processes.Target] = [
        (n.pid, n.argv, n.started) for n in runtime.nodes if n.pid is not None and n.alive()
    ]
    if not targets:
        return []
    log.warning("nodes_orphaned_stopping", state=state_dir, pids=[t[0] for t in targets])
    return processes.stop_all(targets, sig=signal.SIGTERM, timeout_s=timeout_s)


def signal_by_name(name: str) -> signal.Signals:
    """``"SIGKILL"`` → ``signal.SIGKILL``."""
    return signal.Signals[name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}"]


def validate_extra_env(env: Mapping[str, str]) -> dict[str, str]:
    """Extra node variables as a plain dict; names must be non-empty and without ``=``."""
    clean: dict[str, str] = {}
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"not a valid environment variable: {key!r}")
        clean[str(key)] = str(value)
    return clean


def specs_differ(old: Sequence[NodeSpec], new: Sequence[NodeSpec]) -> bool:
    """True if the node sets would run different processes."""
    return len(old) != len(new) or any(not a.same_process(b) for a, b in zip(old, new, strict=True))

"""The node supervisor of an embedded cluster (``python -m allocator.local.supervisor``):
systemd's ``Restart=always`` for the nodes of one state folder (docs/design.md §8). Desired
state comes from ``cluster.json`` (the manager's file); what runs goes to ``nodes/nodes.json``
(this process's file only; see :mod:`allocator.local.nodes`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from allocator.config import load_config, process_environment
from allocator.core import logs
from allocator.core.errors import AllocatorError
from allocator.local import nodes, processes
from allocator.session import reaper

log = logs.get_logger("allocator.local.supervisor")

POLL_INTERVAL_S = 0.1
BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 2.0
BACKOFF_RESET_UPTIME_S = 10.0
SPAWN_FAILED_EXIT_CODE = 127
REAP_TIMEOUT_S = 2.0
STATE_FILE = "cluster.json"  # the manager's record (allocator.local.folder.STATE_FILE)


@dataclass
class _Desired:
    generation: int
    specs: dict[str, nodes.NodeSpec]


@dataclass
class _Node:
    spec: nodes.NodeSpec
    proc: subprocess.Popen[bytes] | None = None
    record: nodes.NodeRecord = field(default_factory=lambda: nodes.NodeRecord(name=""))
    started_mono: float = 0.0
    backoff_s: float = 0.0
    restart_at: float | None = None
    stop_sent: bool = False
    kill_at: float | None = None  # when a requested stop escalates to SIGKILL
    killed: bool = False
    removed: bool = False  # no longer in the spec: stop, then forget


class Supervisor:
    """Runs, restarts and stops the nodes of ``state_dir``; :meth:`run` returns the exit code.

    The parent of every node, so it reaps them and knows their exit codes. A paused node
    (SIGSTOP) is alive: the supervisor leaves it alone.
    """

    def __init__(self, state_dir: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.state_dir = state_dir
        self._clock = clock
        self._env = nodes.base_env(process_environment())
        self._nodes: dict[str, _Node] = {}
        self._generation = 0
        self._applied = 0
        self._shutting_down = False
        self._last_written: dict[str, Any] | None = None

    # -- entry point ------------------------------------------------------------------------

    def run(self) -> int:
        """The loop, under ``nodes/supervisor.lock`` (flock): a second supervisor for the same
        folder exits 1 at once. Node processes left by an earlier supervisor that was killed
        (not our children, so unsupervisable) are stopped before anything starts. SIGTERM or
        SIGINT stops every node, records them stopped and exits 0; a failing loop stops the
        nodes and exits 1."""
        lock_path = nodes.nodes_dir(self.state_dir) / nodes.SUPERVISOR_LOCK
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with lock_path.open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.error("supervisor_already_running", state=self.state_dir)
                return 1
            signal.signal(signal.SIGTERM, self._on_stop_signal)
            signal.signal(signal.SIGINT, self._on_stop_signal)
            log.info("supervisor_started", pid=os.getpid(), state=self.state_dir)
            stray = nodes.stop_recorded(self.state_dir)
            if stray:
                log.warning("supervisor_stopped_strays", pids=stray)
            self._write(force=True)
            try:
                while True:
                    self.tick()
                    if self._shutting_down and all(n.proc is None for n in self._nodes.values()):
                        break
                    time.sleep(POLL_INTERVAL_S)
            except Exception:
                # A bug here must not leave nodes running unsupervised.
                log.exception("supervisor_failed", pid=os.getpid(), note="stopping the nodes")
                self._stop_now()
                return 1
            finally:
                self._write(force=True)
            log.info("supervisor_stopped", pid=os.getpid())
        return 0

    def _stop_now(self) -> None:
        """Stop every node at once and wait (the loop is not to be trusted any more)."""
        targets: list[processes.Target] = []
        for node in self._nodes.values():
            if node.proc is not None and node.proc.poll() is None:
                targets.append((node.proc.pid, node.record.argv, node.record.started))
        try:
            processes.stop_all(targets, timeout_s=nodes.STOP_TIMEOUT_S)
        except Exception:
            log.exception("supervisor_stop_failed")
        for node in self._nodes.values():
            if node.proc is not None and node.proc.poll() is not None:
                node.record.pid, node.record.state = None, nodes.STOPPED
                node.record.last_exit_code = node.proc.returncode
                node.proc = None

    def _on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self._shutting_down:
            log.info("supervisor_stopping", signal=signal.Signals(signum).name)
        self._shutting_down = True

    # -- one pass ---------------------------------------------------------------------------

    def tick(self) -> None:
        """Read the desired state, bring every node towards it, record what runs."""
        desired = self._read_desired()
        if desired is not None:
            self._apply(desired)
        now = self._clock()
        for node in list(self._nodes.values()):
            self._step(node, now)
            if node.removed and node.proc is None:
                del self._nodes[node.spec.name]
        if all(self._settled(n) for n in self._nodes.values()):
            self._applied = self._generation
        self._write()

    def _read_desired(self) -> _Desired | None:
        """``cluster.json``'s node specs, read every pass (:data:`POLL_INTERVAL_S`); gone
        (purged) means stop every node and exit."""
        # Parsed at every pass: a few kilobytes, and no change can be missed.
        path = self.state_dir / STATE_FILE
        try:
            raw = json.loads(path.read_text())
            specs = [nodes.NodeSpec.from_json(s) for s in raw.get("nodes", [])]
            generation = int(raw.get("node_generation", 0))
        except FileNotFoundError:
            if not self._shutting_down:
                log.warning("supervisor_record_gone", path=path, note="stopping")
            self._shutting_down = True
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("supervisor_record_unreadable", path=path, error=str(exc))
            return None
        return _Desired(generation, {s.name: s for s in specs})

    def _apply(self, desired: _Desired) -> None:
        self._generation = desired.generation
        for name, spec in desired.specs.items():
            node = self._nodes.get(name)
            if node is None:
                self._nodes[name] = _Node(spec, record=nodes.NodeRecord(name=name))
                continue
            if spec.run and not node.spec.run:
                node.backoff_s = 0.0  # started on request: no backoff
                node.restart_at = None
            node.spec = spec
            node.removed = False
        for name, node in self._nodes.items():
            if name not in desired.specs:
                node.removed = True

    def _wants_run(self, node: _Node) -> bool:
        return not self._shutting_down and not node.removed and node.spec.run

    def _settled(self, node: _Node) -> bool:
        """True if the node is where its desired state wants it.

        A node that is to run counts once it has been started, or failed to start and is
        waiting to be restarted: a request never waits for a crash loop to end.
        """
        if self._wants_run(node):
            started = node.proc is not None or node.record.state == nodes.RESTARTING
            return started and not node.stop_sent
        return node.proc is None

    def _step(self, node: _Node, now: float) -> None:
        if node.proc is not None and node.proc.poll() is not None:
            self._exited(node, now)
        if node.proc is not None:
            if not self._wants_run(node) and not node.stop_sent:
                self._request_stop(node, now)
            elif node.stop_sent and node.kill_at is not None and now >= node.kill_at:
                self._kill(node, now)
            return
        if not self._wants_run(node):
            node.record.state = nodes.STOPPED
            node.restart_at = None
            return
        if node.restart_at is None or now >= node.restart_at:
            self._start(node, now)

    # -- transitions ------------------------------------------------------------------------

    def _start(self, node: _Node, now: float) -> None:
        """Spawns the node in its own session, output appended to ``nodes/<name>.log``, the
        state folder as working folder, environment :func:`~allocator.local.nodes.base_env`
        plus the node's spec. One that cannot be spawned counts as exited with 127."""
        record = node.record
        if record.state == nodes.RESTARTING:
            record.restarts += 1
        node.restart_at = None
        path = nodes.log_path(self.state_dir, node.spec.name)
        try:
            proc = processes.spawn(
                node.spec.argv,
                log_path=path,
                env={**self._env, **node.spec.env},
                cwd=self.state_dir,
            )
        except AllocatorError as exc:
            cause = exc.__cause__ or exc
            log.error("node_spawn_failed", name=node.spec.name, error=str(cause))
            with contextlib.suppress(OSError), path.open("a") as out:
                out.write(f"allocator local: could not start {node.spec.argv[0]}: {cause}\n")
            record.last_exit_code = SPAWN_FAILED_EXIT_CODE
            record.state = nodes.RESTARTING
            self._schedule_restart(node, now, uptime_s=0.0)
            return
        node.proc = proc
        node.started_mono = now
        node.stop_sent = node.killed = False
        node.kill_at = None
        record.pid = proc.pid
        record.argv = list(processes.cmdline(proc.pid) or node.spec.argv)
        record.started = processes.start_time(proc.pid)
        record.started_at = datetime.now(UTC).isoformat(timespec="milliseconds")
        record.state = nodes.RUNNING
        log.info("node_started", name=node.spec.name, pid=proc.pid, restarts=record.restarts)

    def _exited(self, node: _Node, now: float) -> None:
        assert node.proc is not None
        code = node.proc.returncode
        uptime_s = now - node.started_mono
        record = node.record
        record.last_exit_code = code
        pid = node.proc.pid
        record.pid = None
        requested = node.stop_sent
        node.proc = None
        node.stop_sent = node.killed = False
        node.kill_at = None
        log.info(
            "node_exited",
            name=node.spec.name,
            code=code,
            uptime_s=round(uptime_s, 1),
            requested=requested,
        )
        self._reap(node, pid)
        if requested or not self._wants_run(node):
            record.state = nodes.STOPPED
            return
        record.state = nodes.RESTARTING
        self._schedule_restart(node, now, uptime_s)

    def _reap(self, node: _Node, pid: int) -> None:
        """Close the session the exited node left, if any (it died without closing it):
        our child handle proved it dead, so its successor need not wait for ZooKeeper to
        expire the session. In a thread, so a ZooKeeper outage never stalls the loop; the
        restarted node would reap it too (closing twice is harmless). The session file is
        removed only while it still names the closed session and the restarted node does
        not hold the state folder's lock (:func:`allocator.session.reaper.reap`)."""
        env = {**self._env, **node.spec.env}
        threading.Thread(
            target=_reap_exited, args=(env, pid), name=f"reap-{node.spec.name}", daemon=True
        ).start()

    def _schedule_restart(self, node: _Node, now: float, uptime_s: float) -> None:
        """A node that exited unasked (any code, any signal) restarts after a backoff:
        :data:`BACKOFF_MIN_S` doubling up to :data:`BACKOFF_MAX_S`, back to the minimum
        after an uptime of :data:`BACKOFF_RESET_UPTIME_S`. A node started on request (its
        spec's ``run`` turned true) starts at once, without backoff (:meth:`_apply`)."""
        if node.backoff_s <= 0.0 or uptime_s >= BACKOFF_RESET_UPTIME_S:
            node.backoff_s = BACKOFF_MIN_S
        else:
            node.backoff_s = min(node.backoff_s * 2, BACKOFF_MAX_S)
        node.restart_at = now + node.backoff_s
        log.info("node_restart_scheduled", name=node.spec.name, in_s=node.backoff_s)

    def _request_stop(self, node: _Node, now: float) -> None:
        """Sends the spec's ``stop_signal`` (SIGTERM, or SIGKILL for ``node-stop --kill``)
        then SIGCONT; SIGKILL to its group after the spec's ``stop_timeout_s`` (the node's
        ``node.shutdown_timeout_s`` plus a margin). Not restarted until ``run`` again."""
        assert node.proc is not None
        sig = signal.SIGTERM
        if not self._shutting_down and not node.removed:
            sig = nodes.signal_by_name(node.spec.stop_signal)
        log.info("node_stopping", name=node.spec.name, pid=node.proc.pid, signal=sig.name)
        node.stop_sent = True
        node.record.state = nodes.STOPPING
        if sig == signal.SIGKILL:
            self._kill(node, now)
            return
        with contextlib.suppress(ProcessLookupError):
            node.proc.send_signal(sig)
            node.proc.send_signal(signal.SIGCONT)  # a paused node must see it now
        node.kill_at = now + node.spec.stop_timeout_s

    def _kill(self, node: _Node, now: float) -> None:
        """SIGKILL the node and its process group (it leads its own session)."""
        assert node.proc is not None
        pid = node.proc.pid
        if node.kill_at is not None and not node.killed:
            log.warning("node_kill_escalated", name=node.spec.name, pid=pid)
        # Not reaped yet, so the pid cannot have been reused.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            node.proc.kill()
        node.killed = True
        node.kill_at = now + nodes.KILL_TIMEOUT_S  # retried if it somehow survives

    # -- the record -------------------------------------------------------------------------

    def _write(self, *, force: bool = False) -> None:
        runtime = nodes.Runtime(
            supervisor_pid=os.getpid(),
            applied_generation=self._applied,
            nodes=[n.record for n in sorted(self._nodes.values(), key=lambda n: n.spec.name)],
        )
        data = runtime.to_json()
        if not force and data == self._last_written:
            return
        try:
            nodes.write_runtime(self.state_dir, runtime)
        except OSError as exc:
            log.error("nodes_record_write_failed", error=str(exc))
            return
        self._last_written = data


def _reap_exited(env: dict[str, str], pid: int) -> None:
    """Reap the session node process ``pid`` (configured by ``env``) left behind."""
    try:
        config = load_config(env=env)
    except AllocatorError as exc:
        log.warning("node_reap_skipped", pid=pid, error=str(exc))
        return
    state_dir = config.node.state_path()
    if state_dir is None or not config.node.name:
        return  # nothing recorded, or a name that cannot be recognised (the node says so)
    try:
        reaper.reap(state_dir, reaper.self_of(config), exited_pid=pid, timeout_s=REAP_TIMEOUT_S)
    except Exception:  # a reaper thread must never take the supervisor down
        log.exception("node_reap_failed", pid=pid)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m allocator.local.supervisor --state-dir DIR``; the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m allocator.local.supervisor",
        description="Run and restart the nodes of an embedded cluster (allocator local).",
    )
    parser.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    root = logging.getLogger()
    root.addHandler(logs.handler())  # secrets masked, as every log line of the project
    root.setLevel(logging.INFO)
    return Supervisor(args.state_dir.resolve()).run()


if __name__ == "__main__":
    sys.exit(main())

"""The state folder of one embedded cluster: its layout, its lock, its record on disk."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from allocator.core import logs
from allocator.core.errors import LocalClusterError
from allocator.local import postgres
from allocator.local.record import State

log = logs.get_logger(__name__)

STATE_FILE = "cluster.json"
LOCK_FILE = ".lock"
SECRETS_DIR = "secrets"
"""``<state>/secrets/``: the cluster's secrets one per file, for ``*_FILE`` variables."""
LOCK_TIMEOUT_S = 120.0
LOCK_POLL_INTERVAL_S = 0.05
_CREATED_SUBTREES = ("zk", postgres.FIRST_SERVER, postgres.STANDBY_SERVER, "nodes", SECRETS_DIR)


class StateFolder:
    """The folder of one cluster: everything of the cluster lives in it.

    ``cluster.json`` (the record), ``.lock``, ``zk/<id>/``, ``pg/``, ``pg-standby/``,
    ``nodes/`` and ``secrets/`` (written by :mod:`allocator.local.client_env`; see
    ``deploy/local/README.md``). Several clusters run side by side in different state
    folders. A folder with no record (or none at all) is "no local cluster in DIR"; a path
    that cannot be a folder (under a file, a name too long) is "cannot use DIR as a state
    folder": both :class:`LocalClusterError`, never an ``OSError``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def state_file(self) -> Path:
        """``<state>/cluster.json``."""
        return self.path / STATE_FILE

    def exists(self) -> bool:
        """True if a cluster is recorded in the folder."""
        try:
            return self.state_file.is_file()
        except OSError as exc:  # e.g. a name too long: no cluster can be recorded there
            raise self.unusable(exc) from exc

    def create(self) -> None:
        """Make the folder (and its parents) if missing."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # under a file, a name too long, no permission
            raise self.unusable(exc) from exc

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive ``flock`` on ``.lock``: commands that start or stop processes do.

        ``status`` and ``signal_node`` only read and never take it. Waits up to
        ``LOCK_TIMEOUT_S`` for another command to finish.
        """
        path = self.path / LOCK_FILE
        try:
            handle = path.open("a")
        except (FileNotFoundError, NotADirectoryError):
            self.require()  # no folder, so no cluster recorded: say that
            raise
        except OSError as exc:
            raise self.unusable(exc) from exc
        with handle:
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LocalClusterError(
                            f"another `allocator local` command holds {path}"
                        ) from None
                    time.sleep(LOCK_POLL_INTERVAL_S)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def load(self) -> State | None:
        """The record, or None if there is none."""
        try:
            text = self.state_file.read_text()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self.unusable(exc) from exc
        try:
            return State.from_json(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            raise LocalClusterError(
                f"{self.state_file} is not a valid cluster record ({exc}); stop the processes "
                "it lists by their pids, then remove it"
            ) from exc

    def unusable(self, exc: OSError) -> LocalClusterError:
        """The error for a state folder the OS refused (``exc``), naming the folder."""
        return LocalClusterError(f"cannot use {self.path} as a state folder: {exc.strerror or exc}")

    def require(self) -> State:
        """The record, or :class:`LocalClusterError` saying how to start a cluster."""
        state = self.load()
        if state is None:
            raise LocalClusterError(
                f"no local cluster in {self.path}: start one with "
                f"`allocator local up --state-dir {self.path}`"
            )
        return state

    def save(self, state: State) -> None:
        """Rewrite the record atomically, mode 0600.

        Called right after each process starts or stops, so another process (``allocator
        local status|down``), or a later ``up`` after a crash of the manager half-way, sees
        exactly what was started. Mode 0600: the record holds the cluster's secrets (admin
        token, ZooKeeper identity).
        """
        tmp = self.state_file.with_name(STATE_FILE + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # a leftover could carry wider permissions
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(state.to_json(), indent=2) + "\n")
        tmp.replace(self.state_file)

    def purge(self, state: State) -> None:
        """Delete the cluster's data: only what the cluster created, never other files."""
        for server in state.pg_servers():
            relocated = postgres.relocated_data_dir(self.path, server.server)
            if relocated is not None:
                shutil.rmtree(relocated, ignore_errors=True)
        for name in _CREATED_SUBTREES:
            shutil.rmtree(self.path / name, ignore_errors=True)
        for name in (STATE_FILE, LOCK_FILE):
            with contextlib.suppress(FileNotFoundError):
                (self.path / name).unlink()
        with contextlib.suppress(OSError):
            self.path.rmdir()  # only if nothing else is in it
        log.info("cluster_purged", state=self.path, zk_servers=len(state.zk))

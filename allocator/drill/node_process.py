"""One ``allocator run`` process the drill starts itself, outside the cluster's supervisor:
with a command of its own (an earlier release's) and nobody restarting it. The rolling
upgrade runs its nodes this way, so replacing one is stopping it and starting another.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from allocator.config import process_environment
from allocator.local import nodes as nodes_mod

STOP_TIMEOUT_S: Final = 15.0
STATUS_TIMEOUT_S: Final = 2.0


class NodeProcess:
    """``command`` (an ``allocator run``) with ``env`` on top of the cluster's base
    environment, its output appended to ``log_path``; :meth:`stop` ends it (always call it)."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self.admin_url = f"http://{env['ALLOCATOR_NODE_ADMIN_ADDRESS']}"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                list(command),
                env={**nodes_mod.base_env(process_environment()), **env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def exit_code(self) -> int | None:
        return self._proc.poll()

    def role(self) -> str | None:
        """The role the node's own ``/status`` reports; None when it does not answer."""
        try:
            with urllib.request.urlopen(  # noqa: S310 (the drill's own loopback node)
                f"{self.admin_url}/status", timeout=STATUS_TIMEOUT_S
            ) as response:
                body = json.loads(response.read(65536))
        except (OSError, ValueError):
            return None
        role = body.get("role") if isinstance(body, dict) else None
        return role if isinstance(role, str) else None

    def stop(self) -> int | None:
        """SIGTERM (and SIGCONT, for a paused one), then SIGKILL to its process group after
        :data:`STOP_TIMEOUT_S`; its exit code (0: it stopped cleanly)."""
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)
                self._proc.send_signal(signal.SIGCONT)
            try:
                self._proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(STOP_TIMEOUT_S)
        return self._proc.returncode

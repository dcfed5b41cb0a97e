"""Running a command in a pid namespace of its own (``unshare``), for the reaper's tests: the
wrappers, and why they cannot run here ("" when they can: root, util-linux, a kernel that
lets us; CI runs as root)."""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache

NEW_PID_NAMESPACE = ["unshare", "--pid", "--fork", "--mount-proc"]
"""``docker compose run``, a ``kubectl debug`` container: a pid namespace of its own, with
its own ``/proc``."""
OUTER_PROC = ["unshare", "--pid", "--fork"]
"""A new pid namespace that still sees the outer ``/proc``: the process cannot see itself."""
NO_PROC = ["unshare", "--mount", "sh", "-c", 'mount -t tmpfs none /proc && exec "$0" "$@"']
"""Same pid namespace, but an empty ``/proc``: nothing can be read."""


@cache
def why_not() -> str:
    """Why these wrappers cannot run here ("" when they can)."""
    if os.geteuid() != 0:
        return "unshare --pid and mount need root (CI runs as root)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    for wrapper in (NEW_PID_NAMESPACE, NO_PROC):
        probe = subprocess.run(
            [*wrapper, "true"], capture_output=True, text=True, timeout=60, check=False
        )
        if probe.returncode != 0:
            return f"{wrapper[:4]} does not work here: {probe.stderr.strip()}"
    return ""

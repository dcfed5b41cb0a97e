"""A stand-in node for the drill's shim tests: prints what it was started as, then exits.

Run as ``python -m tests.fakes.env_child [EXIT_CODE]``: one JSON line with its environment,
wall clock, ``/proc/self/cmdline`` (the command line the supervisor would see) and whether
a sleep as kazoo's reconnect loop takes one worked, then exits with EXIT_CODE (default 0).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from allocator.config import process_environment


def sleep_error() -> str | None:
    """What a short sleep through kazoo's default ``sleep_func`` raised, if anything."""
    from kazoo.retry import KazooRetry  # imported here, as late as the node would

    try:
        KazooRetry().sleep_func(0.01)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def main() -> int:
    cmdline = Path("/proc/self/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    report = {
        "env": process_environment(),
        "time": time.time(),
        "cmdline": [part.decode() for part in cmdline],
        "sleep_error": sleep_error(),
    }
    print(json.dumps(report))
    return int(sys.argv[1]) if len(sys.argv) > 1 else 0


if __name__ == "__main__":
    sys.exit(main())

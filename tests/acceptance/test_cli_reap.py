"""``allocator reap-session`` in a subprocess: nothing to reap is said in one line (exit 0);
a node without a configured name cannot reap (exit 78). Reaping itself:
tests/chaos/test_reaping.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))


def test_reap_session_with_nothing_to_reap_says_so(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ALLOCATOR_")},
        "ALLOCATOR_ZOOKEEPER_HOSTS": "127.0.0.1:1/allocator",
        "ALLOCATOR_ZOOKEEPER_INSECURE": "true",
        "ALLOCATOR_NODE_NAME": "node-1",
        "ALLOCATOR_NODE_STATE_DIR": str(tmp_path / "state"),
    }
    (tmp_path / "state").mkdir(mode=0o700)
    done = subprocess.run(
        [ALLOCATOR, "reap-session"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("nothing:")
    unnamed = {k: v for k, v in env.items() if k != "ALLOCATOR_NODE_NAME"}
    refused = subprocess.run(
        [ALLOCATOR, "reap-session"], env=unnamed, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 78
    assert "node.name" in refused.stderr

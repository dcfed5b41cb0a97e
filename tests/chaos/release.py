"""An earlier release of the allocator, run next to this checkout's code (rolling upgrade).

Rules:

- :data:`UPGRADE_FROM` is the release a rolling upgrade starts from. It is built once from
  its git revision into ``.cache/releases/<rev>/`` (a virtualenv of its own, by
  ``scripts/build-release.sh``; ``make test`` builds it first) and reused across runs.
- Its commands run with the release's own interpreter and ``PYTHONPATH`` emptied: the
  harness puts this checkout first on ``PYTHONPATH`` (:func:`allocator.local.nodes.base_env`),
  which would otherwise run today's code under the old release's name.

Run ``python -m tests.chaos.release`` to build it (prints its folder).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

UPGRADE_FROM = "4b4f865"
"""The release a rolling upgrade starts from: its schema is revision 0009."""
UPGRADE_FROM_SCHEMA = "0009"
UPGRADE_FROM_VERSION = "0.1.0"
"""Its ``allocator.__version__``, which its nodes report (``allocator_build_info``)."""
ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-release.sh"
BUILD_TIMEOUT_S = 600
OLD_CODE_ENV = {"PYTHONPATH": ""}
"""What an old release's process needs on top of the harness's environment (see the rules)."""


NOT_IN_HISTORY = 69
"""scripts/build-release.sh's exit code for a revision the clone does not have (shallow)."""


class NotInHistoryError(RuntimeError):
    """The clone lacks the release's revision (a shallow clone): nothing to build it from."""


def build(rev: str = UPGRADE_FROM) -> Path:
    """The release's folder, built first if it is not there yet (its ``.venv`` inside);
    :class:`NotInHistoryError` when the clone does not have ``rev``."""
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT), rev],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    if done.returncode == NOT_IN_HISTORY:
        raise NotInHistoryError(done.stderr.strip())
    if done.returncode != 0:
        raise RuntimeError(f"building release {rev} failed ({done.returncode}): {done.stderr}")
    return Path(done.stdout.strip().splitlines()[-1])


def allocator_command(release: Path, *args: str) -> list[str]:
    """``allocator ARGS…`` of the release built in ``release``."""
    return [str(release / ".venv" / "bin" / "allocator"), *args]


if __name__ == "__main__":
    # `make test` builds it first; a shallow clone cannot, and the test then says why it
    # skips (a skip in the report, not a failure of the whole run).
    try:
        print(build())
    except NotInHistoryError as exc:
        print(f"warning: {exc}; the rolling-upgrade test will be skipped")

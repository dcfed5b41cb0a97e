"""An earlier release of the allocator, run next to this checkout's code (rolling upgrade).

Rules:

- A release is a folder with a virtualenv of its own at ``.venv`` whose ``bin/allocator`` is
  that release's command; ``scripts/build-release.sh REV`` builds one from a git revision of
  this clone into ``.cache/releases/<REV>/`` (once; kept across runs).
- Its commands run with ``PYTHONPATH`` emptied (:data:`OLD_CODE_ENV`): the local cluster puts
  this checkout first on ``PYTHONPATH`` (:func:`allocator.local.nodes.base_env`), which would
  otherwise run today's code under the old release's name.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Final

from allocator.core.errors import UsageError

ROOT: Final = Path(__file__).resolve().parents[2]
BUILD_SCRIPT: Final = ROOT / "scripts" / "build-release.sh"
BUILD_TIMEOUT_S: Final = 600
OLD_CODE_ENV: Final = {"PYTHONPATH": ""}
"""What an old release's process needs on top of the cluster's environment (see the rules)."""
NOT_IN_HISTORY: Final = 69
"""scripts/build-release.sh's exit code for a revision the clone does not have (shallow)."""


class NotInHistoryError(UsageError):
    """The clone lacks the release's revision (a shallow clone): nothing to build it from."""


def command_path(release: Path) -> Path:
    """The release's own ``allocator`` executable."""
    return release / ".venv" / "bin" / "allocator"


def allocator_command(release: Path, *args: str) -> list[str]:
    """``allocator ARGS…`` of the release built in ``release``."""
    return [str(command_path(release)), *args]


def build(rev: str) -> Path:
    """The folder of release ``rev`` (a git revision of this clone), built first if it is not
    there yet; :class:`NotInHistoryError` when the clone does not have ``rev``."""
    if not BUILD_SCRIPT.is_file():
        raise UsageError(
            f"cannot build release {rev!r}: {BUILD_SCRIPT} is missing (not a source checkout); "
            "give --from-release a built release folder"
        )
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
        raise UsageError(f"building release {rev!r} failed ({done.returncode}): {done.stderr}")
    return Path(done.stdout.strip().splitlines()[-1])


def resolve(from_release: str) -> Path:
    """``--from-release``'s folder: a built release folder as given, else a git revision
    built by :func:`build`. A folder without the release's command is an error naming it."""
    given = Path(from_release)
    if given.is_dir():
        if not command_path(given).is_file():
            raise UsageError(
                f"--from-release {from_release}: no {command_path(given)} "
                "(a release folder as scripts/build-release.sh makes one)"
            )
        return given.resolve()
    return build(from_release)

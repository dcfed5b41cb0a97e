"""The release a rolling upgrade starts from (tests/chaos/test_rolling_upgrade.py).

Building and running an earlier release is the product's (:mod:`allocator.drill.release`,
also used by ``allocator drill --scenario rolling-upgrade``); this names which one the suite
uses. It is built once from its git revision into ``.cache/releases/<rev>/`` (``make test``
builds it first) and reused across runs.

Run ``python -m tests.chaos.release`` to build it (prints its folder).
"""

from __future__ import annotations

from pathlib import Path

from allocator.drill.release import OLD_CODE_ENV, NotInHistoryError, allocator_command
from allocator.drill.release import build as build_release

__all__ = ["OLD_CODE_ENV", "NotInHistoryError", "allocator_command", "build"]

UPGRADE_FROM = "4b4f865"
"""The release a rolling upgrade starts from: its schema is revision 0009."""
UPGRADE_FROM_SCHEMA = "0009"
UPGRADE_FROM_VERSION = "0.1.0"
"""Its ``allocator.__version__``, which its nodes report (``allocator_build_info``)."""


def build(rev: str = UPGRADE_FROM) -> Path:
    """The release's folder, built first if it is not there yet (its ``.venv`` inside);
    :class:`NotInHistoryError` when the clone does not have ``rev``."""
    return build_release(rev)


if __name__ == "__main__":
    # `make test` builds it first; a shallow clone cannot, and the test then says why it
    # skips (a skip in the report, not a failure of the whole run).
    try:
        print(build())
    except NotInHistoryError as exc:
        print(f"warning: {exc}; the rolling-upgrade test will be skipped")

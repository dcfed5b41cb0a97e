"""The ``allocator`` console script's entry point: :func:`allocator.cli.main`, or one line
saying how to install the node's dependencies when they are missing.

Imports nothing at module level beyond the standard library and ``allocator`` itself (whose
``__init__`` imports nothing).
"""

from __future__ import annotations

import sys

from allocator import DISTRIBUTION, VERSION_MESSAGE, __version__

NODE_EXTRA = f"{DISTRIBUTION}[node]"
EXIT_MISSING_PREREQUISITE = 69


def main() -> None:
    """Run the CLI, or explain that the node's dependencies are not installed.

    ``pip install snowflake-block-allocator`` is the client-only install
    (:mod:`allocator.client` with psycopg, psycopg-pool and structlog); the CLI and the node
    need the ``node`` extra. The console script is installed either way, so a missing
    third-party module ends in one line on stderr and exit 69 (a missing prerequisite)
    instead of a traceback. ``--version`` answers in a client-only install too (exit 0, the
    CLI's line). Only a missing module outside ``allocator`` is explained; a missing
    ``allocator`` module (a broken install) and every other import error propagate
    unchanged.
    """
    try:
        from allocator.cli import main as cli_main
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if not missing or missing.partition(".")[0] == "allocator":
            raise
        if sys.argv[1:] == ["--version"]:
            fields = {"prog": "allocator", "version": __version__, "package": DISTRIBUTION}
            sys.stdout.write(VERSION_MESSAGE % fields + "\n")
            sys.exit(0)
        sys.stderr.write(
            f"error: the allocator command needs the node's dependencies ({missing!r} is not "
            f"installed; this looks like a client-only install): pip install '{NODE_EXTRA}'\n"
        )
        sys.exit(EXIT_MISSING_PREREQUISITE)
    cli_main()

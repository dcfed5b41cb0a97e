"""The node command of a drilled cluster: point a node at its proxies, skew its clock, run it.

Usage: ``python -m allocator.drill.shim --links DIR -- <python> -m <module> [args]``; the
drill gives it to the embedded cluster as the node command, so the supervisor starts every
node through it. :func:`node_env` is pure (the unit tests' seam); only :func:`main` reads
and execs.
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import SupportsIndex

from allocator.config import process_environment
from allocator.core.errors import ConfigError, PrerequisiteError
from allocator.drill.links import NodeLinks, read_node_links
from allocator.local.tcp_ports import LOOPBACK

PROG = "allocator.drill.shim"
NODE_NAME_VAR = "ALLOCATOR_NODE_NAME"
REWRITTEN_VARS = ("ALLOCATOR_ZOOKEEPER_HOSTS", "ALLOCATOR_POSTGRES_URL")
LIBFAKETIME_PATHS = (
    Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),  # Debian, Ubuntu
    Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"),
    Path("/usr/lib64/faketime/libfaketime.so.1"),  # Fedora
    Path("/usr/lib/faketime/libfaketime.so.1"),  # Arch, Alpine
    Path("/usr/local/lib/faketime/libfaketime.so.1"),  # built from source
)
APPLIED_VAR = "DRILL_SHIM_APPLIED"
"""Set in the re-exec'd shim: the environment already carries the links (not ALLOCATOR_*:
the node's configuration must not see it)."""
EXIT_UNAVAILABLE = 69
EXIT_CONFIG = 78
EXIT_CANNOT_RUN = 126

# The address, not part of a longer one (no digit or dot before it); the port taken whole.
_ADDRESS = re.compile(rf"(?<![0-9.]){re.escape(LOOPBACK)}:([0-9]+)")


def rewrite_addresses(text: str, ports: Mapping[int, int]) -> str:
    """``text`` with each ``127.0.0.1:<upstream>`` that ``ports`` maps made
    ``127.0.0.1:<proxy>``; every other character as it was (a port is matched whole: 5432
    never matches inside 54321; the chroot, user, database and query stay)."""

    def swap(match: re.Match[str]) -> str:
        proxy = ports.get(int(match.group(1)))
        return match.group(0) if proxy is None else f"{LOOPBACK}:{proxy}"

    return _ADDRESS.sub(swap, text)


def node_env(
    env: Mapping[str, str], links: NodeLinks | None, libfaketime: Path | None
) -> dict[str, str]:
    """The node's environment: ``env`` with ``links`` applied; ``links`` None gives ``env``
    unchanged. ``libfaketime`` is needed when ``links.faketime`` is set.

    Only :data:`REWRITTEN_VARS` change (:func:`rewrite_addresses`). A clock offset runs the
    node under libfaketime: ``LD_PRELOAD`` (put before any preload already set),
    ``FAKETIME=<offset>`` and ``FAKETIME_DONT_FAKE_MONOTONIC=1``, without which Python's
    threading waits never return; only the wall clock moves. (Under libfaketime
    ``time.sleep`` fails with EINVAL on Python 3.11: :func:`sleep_on_a_condition`.)"""
    result = dict(env)
    if links is None:
        return result
    for var in REWRITTEN_VARS:
        if var in result:
            result[var] = rewrite_addresses(result[var], links.ports)
    if links.faketime is not None:
        if libfaketime is None:
            raise ValueError("a clock offset needs the libfaketime library")
        preload = result.get("LD_PRELOAD")
        result["LD_PRELOAD"] = f"{libfaketime}:{preload}" if preload else str(libfaketime)
        result["FAKETIME"] = links.faketime
        result["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    return result


def find_libfaketime(candidates: Iterable[Path] = LIBFAKETIME_PATHS) -> Path:
    """The first of ``candidates`` that exists, else
    :class:`~allocator.core.errors.PrerequisiteError`."""
    paths = list(candidates)
    for path in paths:
        if path.is_file():
            return path
    looked = ", ".join(str(path) for path in paths)
    raise PrerequisiteError(
        f"libfaketime not found (looked at {looked}); install it (Debian: apt-get install faketime)"
    )


def command(links_dir: Path, node_argv: Sequence[str]) -> list[str]:
    """The node command that runs ``node_argv`` through the shim, reading ``links_dir``."""
    return [sys.executable, "-m", PROG, "--links", str(links_dir), "--", *node_argv]


def _parse(argv: Sequence[str]) -> tuple[Path, list[str]]:
    parser = argparse.ArgumentParser(
        prog=f"python -m {PROG}", usage="%(prog)s --links DIR -- NODE_ARGV..."
    )
    parser.add_argument("--links", type=Path, required=True, metavar="DIR")
    args = list(argv)
    if "--" not in args:
        parser.error("expected -- and the node's argv after it")
    split = args.index("--")
    node_argv = args[split + 1 :]
    if not node_argv:
        parser.error("expected the node's argv after --")
    return parser.parse_args(args[:split]).links, node_argv


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def node_module(node_argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """``(module, args)`` of a ``<python> -m <module> [args]`` argv; None for any other."""
    if len(node_argv) >= 3 and node_argv[1] == "-m" and "python" in Path(node_argv[0]).name:
        return node_argv[2], list(node_argv[3:])
    return None


def sleep_on_a_condition() -> None:
    """Make ``time.sleep`` wait on a condition variable, in this process, before the node's
    modules are imported.

    libfaketime 0.9.10 with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` fails every
    ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` with EINVAL, and Python 3.11's
    ``time.sleep`` is built on it; a condition's timed wait works. kazoo binds ``time.sleep``
    when it is imported (its connection retry's default ``sleep_func``), and its reconnect
    loop sleeps: without this, a skewed node's first lost connection kills kazoo's
    connection thread, and the session with it, for a reason no real clock has.
    """

    def sleep(duration: float | SupportsIndex) -> None:
        seconds = float(duration)
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        threading.Event().wait(seconds)

    time.sleep = sleep


def _run_module(module: str, args: list[str]) -> int:
    """Run ``module`` as ``python -m`` would, in this process; its exit code."""
    sys.argv = [module, *args]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the node of ``argv`` (default: this process's arguments) with its links. Returns
    the node's exit code, or the shim's own when it cannot run it.

    The node's name is ``ALLOCATOR_NODE_NAME``, its links ``DIR/<name>.json``
    (:mod:`allocator.drill.links`). No links file means no drill: the node runs unchanged
    (how a kept cluster returns to direct links, each node at its next restart). A links
    file that cannot be used, no node name or an argv other than ``<python> -m <module>``:
    exit 78 with one line on stderr (no libfaketime: 69), so a node never starts with links
    half applied. The node keeps the shim's pid *and command line*, because the supervisor
    judges a node alive (and signals it) only while pid, argv and start time all match: so
    the shim never execs the node's argv. With links it re-execs itself (``sys.orig_argv``)
    with the rewritten environment and :data:`APPLIED_VAR` set; that pass, or one without
    links, runs the node's module in this process (``runpy``, as ``python -m`` would).
    Signals and the exit code are the node's own."""
    links_dir, node_argv = _parse(sys.argv[1:] if argv is None else argv)
    target = node_module(node_argv)
    if target is None:
        shown = " ".join(node_argv)
        return _fail(f"the node command must be <python> -m <module> ...: {shown}", EXIT_CONFIG)
    env = process_environment()
    if env.get(APPLIED_VAR) == "1":
        if env.get("FAKETIME"):
            sleep_on_a_condition()
        return _run_module(*target)
    name = env.get(NODE_NAME_VAR)
    if not name:
        return _fail(f"{NODE_NAME_VAR} is not set: no links file to read", EXIT_CONFIG)
    try:
        links = read_node_links(links_dir, name)
        libfaketime = find_libfaketime() if links is not None and links.faketime else None
    except ConfigError as exc:
        return _fail(str(exc), EXIT_CONFIG)
    except PrerequisiteError as exc:
        return _fail(str(exc), EXIT_UNAVAILABLE)
    if links is None:
        return _run_module(*target)
    child_env = node_env(env, links, libfaketime)
    child_env[APPLIED_VAR] = "1"
    own = list(sys.orig_argv)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(own[0] if os.path.isabs(own[0]) else sys.executable, own, child_env)  # noqa: S606
    except OSError as exc:
        return _fail(f"cannot re-run {own[0]!r}: {exc.strerror}", EXIT_CANNOT_RUN)


if __name__ == "__main__":
    sys.exit(main())

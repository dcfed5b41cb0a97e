"""Driving the ``allocator`` CLI in-process for the fuzz tests, and judging its answers.

Rules: commands run through click's ``CliRunner`` (one subprocess start costs ~0.7 s here),
in an environment without ``ALLOCATOR_*`` or libpq ``PG*`` variables, with libpq pointed at
a closed loopback port, and the process's signal handlers restored after each run (some
commands install their own). An answer is documented when: it exits with one of
:data:`EXIT_CODES` (the one table, :mod:`allocator.core.exits`), raised nothing but
``SystemExit``, printed no traceback, and a failure printed exactly one error line on stderr
(``error: ...`` or click's ``Error: ...``, or ``Aborted!``) holding no control character,
followed only by indented detail lines; or, a group called without a command, its help (exit
64). Progress lines, notes and warnings may come before it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Mapping, Sequence

import pytest
from click.testing import CliRunner, Result

from allocator.cli import main
from allocator.core.exits import Exit

EXIT_CODES = frozenset(Exit) - {Exit.SESSION_LOST, Exit.FENCED}
"""Every exit code the CLI documents (the one table) but the node's own (``run`` only)."""
ERROR_PREFIXES = ("error: ", "Error: ", "Aborted!")
CLOSED_PORT = "1"
"""A loopback port nothing listens on: a connection attempt fails at once."""
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``ALLOCATOR_*`` or ``PG*`` variable from the machine; libpq aimed at a closed port."""
    for name in list(os.environ):
        if name.startswith(("ALLOCATOR_", "PG")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    monkeypatch.setenv("PGPORT", CLOSED_PORT)
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "1")


def invoke(args: Sequence[str], env: Mapping[str, str | None] | None = None) -> Result:
    """Run ``allocator ARGS`` in-process (a variable ``None`` in ``env`` is removed); the
    signal handlers are restored afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in SIGNALS}
    try:
        return CliRunner().invoke(main, list(args), env=env, catch_exceptions=True)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def has_control_char(text: str) -> bool:
    """A line break or a control character (a tab is fine)."""
    return any(
        (ord(ch) < 32 and ch != "\t") or 127 <= ord(ch) < 160 or ch in "\u2028\u2029" for ch in text
    )


def error_lines(stderr: str) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(stderr.split("\n")):
        if line.startswith(ERROR_PREFIXES):
            yield number, line


def is_group_help(stderr: str) -> bool:
    """A group's ``--help`` text (what click prints for a group called without a command)."""
    return (
        stderr.startswith("Usage: ") and "\nCommands:\n" in stderr and not any(error_lines(stderr))
    )


def check_answer(result: Result, args: Sequence[str]) -> None:
    """Assert ``result`` is a documented answer (see the module's rules)."""
    shown = f"allocator {args!r}: exit {result.exit_code}\n{result.output}"
    exception = result.exception
    assert exception is None or isinstance(exception, SystemExit), f"{shown}\nraised {exception!r}"
    assert result.exit_code in EXIT_CODES, shown
    assert "Traceback" not in result.output, shown
    if result.exit_code == 0:
        return
    stderr = result.stderr
    if result.exit_code == Exit.USAGE and is_group_help(stderr):
        return  # a group called without a command: its help, as the usage error
    found = list(error_lines(stderr))
    assert len(found) == 1, f"{shown}\nexpected one error line on stderr"
    number, line = found[0]
    assert not has_control_char(line), f"{shown}\nthe error line holds a control character"
    after = [text for text in stderr.split("\n")[number + 1 :] if text]
    assert all(text.startswith("  ") for text in after), (
        f"{shown}\nonly indented detail lines may follow the error line"
    )

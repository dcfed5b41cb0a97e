"""``allocator bench``: the benchmark group; each bench registers its own command on it
(``bench_claims``, ``bench_client``, ``bench_slow_consumer``). The benches live in
:mod:`allocator.bench`; what of them is the command's (SIGTERM as Ctrl-C, printing) is here.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import click

from allocator.bench import kit
from allocator.commands.options import (
    EMBEDDED_CLUSTER,
    GROUP_CODES,
    INTERRUPTED,
    OTHER,
    USAGE,
    ExitCode,
    exit_codes,
)
from allocator.core.exits import Exit

BENCH_CODES: tuple[ExitCode, ...] = (
    (
        Exit.OK,
        "measured: the table (or JSON) printed and the JSON written; timings are never judged",
    ),
    USAGE,
    INTERRUPTED,
    OTHER,
    *EMBEDDED_CLUSTER,
    (Exit.TEMPFAIL, "the --database-url server is unreachable: retry later"),
    (Exit.CONFIG, "the --database-url server refused the login (the role named)"),
)
"""Every bench's exit codes (each may start an embedded cluster of its own)."""


@click.group("bench", epilog=exit_codes(*GROUP_CODES))
def bench() -> None:
    """Benchmarks: each prints a table and writes JSON (timings are reported, never judged)."""


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM handler: stop the run like Ctrl-C (cleanup still runs)."""
    raise KeyboardInterrupt


@contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM stops the run like Ctrl-C; either ends the command with click's Abort."""
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except KeyboardInterrupt:
        kit.progress("interrupted")
        raise click.Abort from None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def emit(document: dict[str, Any], out: Path, as_json: bool, table: Iterable[str]) -> None:
    """Write the JSON to ``out``; print it (``as_json``) or the table, then where it went."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(document, indent=2))
    else:
        for line in table:
            click.echo(line)
        click.echo(f"JSON written to {out}")
    kit.progress(f"JSON written to {out}")

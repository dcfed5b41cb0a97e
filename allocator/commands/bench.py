"""``allocator bench``: the benchmark group; each bench registers its own command on it.

Rules: ``bench`` is a plain click group extended by ``bench_claims``, ``bench_client`` and
``bench_slow_consumer`` (``@bench.command(...)`` in their own module);
``allocator.commands`` registers the group once. The benches themselves live in
:mod:`allocator.bench`.
"""

from __future__ import annotations

import click

from allocator.commands.options import (
    EMBEDDED_CLUSTER,
    GROUP_CODES,
    INTERRUPTED,
    OTHER,
    USAGE,
    ExitCode,
    exit_codes,
)

BENCH_CODES: tuple[ExitCode, ...] = (
    (0, "measured: the table (or JSON) printed and the JSON written; timings are never judged"),
    USAGE,
    INTERRUPTED,
    OTHER,
    *EMBEDDED_CLUSTER,
)
"""Every bench's exit codes (each may start an embedded cluster of its own)."""


@click.group("bench", epilog=exit_codes(*GROUP_CODES))
def bench() -> None:
    """Benchmarks: each prints a table and writes JSON (timings are reported, never judged)."""

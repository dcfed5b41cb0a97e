"""pgbench scripts and setup SQL of ``allocator bench claims``, loaded by file name.

One transaction per script (pgbench's unit), no client-side logic; ``:batch`` and
``:step`` come from ``pgbench -D``. ``setup.sql`` creates the three baselines in schema
``bench`` of the bench database only, never in a real allocator database.
"""

from __future__ import annotations

import importlib.resources


def script(name: str) -> str:
    """The text of the bundled file ``name`` (package data of ``allocator.bench.claims.sql``)."""
    return importlib.resources.files(__name__).joinpath(name).read_text()

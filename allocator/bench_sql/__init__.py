"""pgbench scripts and setup SQL of ``allocator bench claims``, loaded by file name.

Rules: one transaction per script (pgbench's unit), no client-side logic; ``:batch`` and
``:step`` come from ``pgbench -D``. ``setup.sql`` creates the three baselines in schema
``bench`` of the bench database only, never in a real allocator database.
"""

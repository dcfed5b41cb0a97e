"""``allocator bench claims``: ``claim_blocks`` next to a SKIP LOCKED queue, a Leaf-style
segment, ``nextval`` and the server's fastest durable commit, driven by pgbench.

Modules: :mod:`~allocator.bench.claims.runner` (the matrix, and the whole run as the
command makes it; its docstring holds the rules of what is measured and how),
:mod:`~allocator.bench.claims.plan`, :mod:`~allocator.bench.claims.contenders` (the compared
methods), :mod:`~allocator.bench.claims.database`, :mod:`~allocator.bench.claims.pgbench`,
:mod:`~allocator.bench.claims.report` (JSON and table), and ``sql/`` (every pgbench script
and setup file, package data).
"""

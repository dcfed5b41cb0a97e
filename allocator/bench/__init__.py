"""The benchmarks behind ``allocator bench``: one package per bench, each split the same way.

Layout:

- :mod:`allocator.bench.claims`: ``claim_blocks`` next to three baselines, driven by pgbench
  (``runner`` drives the matrix, ``contenders`` names the compared methods, ``database``
  stocks the template and its clones, ``pgbench`` runs the load generator, ``report``
  builds the JSON and the table, ``sql/`` holds every pgbench script and setup file).
- :mod:`allocator.bench.slow_consumer`: one claim held open across many claims
  (``runner``, ``plan``, ``tickers`` for the leader and the reader threads, ``pgbench``,
  ``stats`` for windows and ratios, ``queries`` for its SQL, ``report``).
- :mod:`allocator.bench.client`: :class:`allocator.client.IdClient` against a real pool
  (``runner``, ``claimer``, ``timing``, ``report``).
- Shared: :mod:`~allocator.bench.server` (where a bench connects, its own databases),
  :mod:`~allocator.bench.stock` (the layout, epoch and fenced SQL every bench stocks
  with), :mod:`~allocator.bench.kit` (the embedded cluster, progress lines, SIGTERM, the
  JSON file).

Rules: a bench works in databases of its own (or, for the client bench, only claims through
the consumer role), never writes the allocator's tables outside the fenced functions, and
reports timings without judging them. The CLI wrappers live in ``allocator/commands/bench*.py``.
"""

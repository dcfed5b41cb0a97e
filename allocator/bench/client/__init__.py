"""``allocator bench client``: the Python client's IDs/s and the latency of every
``next_id()``, against a real pool.

Modules: :mod:`~allocator.bench.client.runner` (the runs, and the whole bench as the command
makes it; its docstring holds the rules of what is measured and how),
:mod:`~allocator.bench.client.claimer` (the recording claimer),
:mod:`~allocator.bench.client.timing` (the timed loop and its histogram),
:mod:`~allocator.bench.client.results` and :mod:`~allocator.bench.client.report` (JSON and
table).
"""

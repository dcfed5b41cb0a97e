"""``allocator bench slow-consumer``: what one claim left open costs everyone else.

Modules: :mod:`~allocator.bench.slow_consumer.runner` (the experiment, and the whole run as
the command makes it; its docstring holds the rules of what is measured and how),
:mod:`~allocator.bench.slow_consumer.plan`, :mod:`~allocator.bench.slow_consumer.tickers`
(the leader and the reader), :mod:`~allocator.bench.slow_consumer.pgbench` (the claims),
:mod:`~allocator.bench.slow_consumer.stats`, :mod:`~allocator.bench.slow_consumer.queries`
(its SQL, in one named place) and :mod:`~allocator.bench.slow_consumer.report` (JSON and
table).
"""

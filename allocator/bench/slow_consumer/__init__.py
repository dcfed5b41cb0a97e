"""``allocator bench slow-consumer``: what one claim left open costs everyone else.

``runner`` runs the experiment; what is measured and how sits on its functions and on
``plan``, ``tickers`` (leader and reader), ``pgbench``, ``stats``, ``queries`` and ``report``.
"""

"""The benchmarks behind ``allocator bench``: one package per bench (claims, slow_consumer,
client), each split the same way, and what they share (server, stock, kit).

A bench works in databases of its own (the client bench only claims, as the consumer role),
never writes the allocator's tables outside the fenced functions, and reports timings
without judging them (docs/design.md §9). The CLI wrappers are ``allocator/commands/bench*.py``.
"""

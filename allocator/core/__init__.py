"""The domain, free of I/O libraries: errors, the layout and the cutter, the checker, the
leader's term and session guard, health, clocks. Nothing here imports kazoo, psycopg,
click or APScheduler (tests/unit/test_layers.py)."""

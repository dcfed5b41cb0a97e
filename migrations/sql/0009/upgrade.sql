-- pool_status_row runs without JIT: its queries' cost estimates pass PostgreSQL's default
-- jit_above_cost, and compiling them took ~800 ms per call on a pool of 64 blocks (23 ms
-- without). Every node reads pool_status on each refill tick and every /status, so JIT made
-- the refill job overrun its 200 ms interval and the pool run dry in handovers.
ALTER FUNCTION allocator.pool_status_row() SET jit = off;

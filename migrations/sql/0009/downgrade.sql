ALTER FUNCTION allocator.pool_status_row() RESET jit;

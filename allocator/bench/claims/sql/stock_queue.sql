-- Stock the SKIP LOCKED queue: blocks 0..n-1 of block_size IDs each.
INSERT INTO bench.skip_locked_queue (first_id, last_id)
SELECT g * %(block_size)s, g * %(block_size)s + %(block_size)s - 1
  FROM generate_series(0::bigint, %(blocks)s - 1) AS g;

-- allocator schema 0002, downgrade: removes retention; blocks already pruned stay pruned.

DROP FUNCTION allocator.prune_claimed(bigint, timestamptz, integer);

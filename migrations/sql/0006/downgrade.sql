-- 0006 downgrade: the restore procedure goes, with its record.
DROP FUNCTION allocator.reset_after_restore(text, bigint, bigint);
DROP TABLE allocator.pool_resets;

-- 0005 downgrade: the replication report goes; nothing else changed.
DROP FUNCTION allocator.replication_status();

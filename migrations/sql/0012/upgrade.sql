-- allocator schema 0012: the schema's comment cites docs/design.md, in the repository.
COMMENT ON SCHEMA allocator IS 'Snowflake ID block allocator (see docs/design.md §6)';

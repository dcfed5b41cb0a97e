-- allocator schema 0012 undone: the comment 0001 wrote.
COMMENT ON SCHEMA allocator IS 'Snowflake ID block allocator (see DESIGN.md section 6)';

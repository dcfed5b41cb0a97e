-- 0005: how the database replicates, for the nodes' refusal to cut on asynchronous standbys.
-- See migrations/versions/0005_replication_status.py for the rules.

CREATE FUNCTION allocator.replication_status(
    OUT standbys integer,
    OUT synchronous_standbys integer,
    OUT synchronous_standby_names text,
    OUT synchronous_commit text,
    OUT in_recovery boolean
)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT
        ((SELECT count(*) FROM pg_stat_replication)
         + (SELECT count(*) FROM pg_replication_slots
             WHERE slot_type = 'physical' AND NOT active))::integer,
        (SELECT count(*) FROM pg_stat_replication
          WHERE sync_state IN ('sync', 'quorum'))::integer,
        current_setting('synchronous_standby_names'),
        -- The caller's own setting: SECURITY DEFINER keeps the caller's settings unless the
        -- function sets them, and this one sets only search_path.
        current_setting('synchronous_commit'),
        pg_is_in_recovery()
$fn$;

COMMENT ON FUNCTION allocator.replication_status() IS
    'How this server replicates: standbys (streaming now, or a physical slot waiting for one), '
    'how many of those a commit waits for, synchronous_standby_names, the caller''s '
    'synchronous_commit, and whether this server is itself a standby. Nodes refuse to cut '
    'when standbys > 0 and no commit waits for one (unless postgres.allow_async_replication).';

REVOKE ALL ON FUNCTION allocator.replication_status() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION allocator.replication_status() TO allocator_node, allocator_operator;

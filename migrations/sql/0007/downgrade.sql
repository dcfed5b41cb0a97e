-- 0007 downgrade: back to the 0006 privileges. Whoever runs the downgrade owns the schema
-- again (as whoever ran the migrations did before 0007); allocator_owner is dropped unless
-- another database of the cluster still uses it (roles are cluster-wide) or the migration
-- role may not drop roles.

-- -- ownership back to the migration role --------------------------------------------------
DO $own$
DECLARE
    obj record;
BEGIN
    FOR obj IN
        SELECT p.oid::regprocedure AS name
          FROM pg_proc p
         WHERE p.pronamespace = 'allocator'::regnamespace
    LOOP
        EXECUTE format('ALTER ROUTINE %s OWNER TO %I', obj.name, current_user);
    END LOOP;
    FOR obj IN
        SELECT c.oid::regclass AS name, c.relkind
          FROM pg_class c
         WHERE c.relnamespace = 'allocator'::regnamespace
           AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
           AND NOT EXISTS (SELECT 1 FROM pg_depend d
                            WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                              AND d.refclassid = 'pg_class'::regclass
                              AND d.deptype IN ('a', 'i'))
    LOOP
        EXECUTE format('ALTER %s %s OWNER TO %I',
                       CASE obj.relkind WHEN 'v' THEN 'VIEW'
                                        WHEN 'm' THEN 'MATERIALIZED VIEW'
                                        WHEN 'S' THEN 'SEQUENCE'
                                        WHEN 'f' THEN 'FOREIGN TABLE'
                                        ELSE 'TABLE' END,
                       obj.name, current_user);
    END LOOP;
    EXECUTE format('ALTER SCHEMA allocator OWNER TO %I', current_user);
END
$own$;

ALTER DEFAULT PRIVILEGES FOR ROLE allocator_owner GRANT EXECUTE ON FUNCTIONS TO PUBLIC;

-- -- pool_status as 0003 defined it ------------------------------------------------------
CREATE OR REPLACE VIEW allocator.pool_status AS
WITH position AS (
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END AS claim_position
      FROM allocator.claim_ticket s
), rate AS (
    SELECT (p.claim_position - s.claim_position)::double precision
           / extract(epoch FROM clock_timestamp() - s.sampled_at)::double precision
           AS blocks_per_s
      FROM position p,
           LATERAL (SELECT ps.claim_position, ps.sampled_at
                      FROM allocator.pool_samples ps
                     WHERE ps.sampled_at BETWEEN clock_timestamp() - interval '60 seconds'
                                             AND clock_timestamp() - interval '1 second'
                     ORDER BY ps.sampled_at
                     LIMIT 1) s
)
SELECT a.blocks AS available_blocks,
       a.ids AS available_ids,
       r.blocks_per_s AS claim_rate_blocks_per_s,
       CASE WHEN r.blocks_per_s > 0 THEN a.blocks / r.blocks_per_s END AS runway_s,
       h.last_id AS high_water_id,
       h.last_ticket AS cut_position,
       p.claim_position,
       f.epoch,
       f.holder,
       f.generation,
       allocator.id_time_ms(h.last_id) - allocator.db_now_ms() AS mark_ahead_ms,
       allocator.id_time_ms(h.last_id)
         - floor(extract(epoch FROM h.marked_at) * 1000)::bigint AS mark_lead_ms
  FROM allocator.available_blocks() a
 CROSS JOIN position p
 CROSS JOIN allocator.high_water h
 CROSS JOIN allocator.fence f
  LEFT JOIN rate r ON true;

DROP FUNCTION allocator.pool_status_row();

-- -- the grants of 0006 ------------------------------------------------------------------
REVOKE ALL ON SCHEMA allocator
    FROM PUBLIC, allocator_consumer, allocator_node, allocator_operator;
REVOKE ALL ON ALL TABLES IN SCHEMA allocator
    FROM PUBLIC, allocator_consumer, allocator_node, allocator_operator;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA allocator
    FROM PUBLIC, allocator_consumer, allocator_node, allocator_operator;
REVOKE ALL ON ALL ROUTINES IN SCHEMA allocator
    FROM PUBLIC, allocator_consumer, allocator_node, allocator_operator;

GRANT USAGE ON SCHEMA allocator TO allocator_consumer, allocator_node, allocator_operator;
GRANT SELECT ON allocator.pool_status TO allocator_consumer, allocator_node, allocator_operator;
GRANT EXECUTE ON FUNCTION allocator.available_blocks(), allocator.id_time_ms(bigint),
    allocator.db_now_ms()
    TO allocator_consumer, allocator_node, allocator_operator;
GRANT EXECUTE ON FUNCTION allocator.claim_blocks(text, integer) TO allocator_consumer;
GRANT EXECUTE ON FUNCTION
    allocator.take_fence(bigint, bigint, text, text, integer, jsonb),
    allocator.cut_blocks(bigint, bigint, bigint[], bigint[], jsonb, bigint),
    allocator.requeue_stranded(bigint, bigint),
    allocator.prune_claimed(bigint, bigint, bigint, integer),
    allocator.end_term(bigint, bigint, text),
    allocator.record_pool_sample()
    TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.replication_status() TO allocator_node, allocator_operator;
GRANT EXECUTE ON FUNCTION allocator.rebase_fence(text), allocator.reset_after_restore(text, bigint, bigint)
    TO allocator_operator;
GRANT SELECT ON allocator.block_ledger, allocator.leader_history, allocator.fence_history,
    allocator.layout
    TO allocator_node, allocator_operator;
GRANT SELECT ON allocator.fenced_writes, allocator.held_tickets, allocator.pool_resets
    TO allocator_operator;

-- -- the owner role, unless another database still uses it --------------------------------
DO $owner$
BEGIN
    DROP ROLE IF EXISTS allocator_owner;
EXCEPTION
    WHEN dependent_objects_still_exist THEN
        RAISE NOTICE 'role allocator_owner kept: other databases still use it';
    WHEN insufficient_privilege THEN
        RAISE NOTICE 'role allocator_owner kept: role % may not drop roles', current_user;
END
$owner$;

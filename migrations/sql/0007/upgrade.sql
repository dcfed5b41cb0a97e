-- 0007: database privileges. A NOLOGIN role owns the schema and everything in it; every
-- other role gets exactly the rights of the table in docs/sql.md ("Roles and privileges").
-- See migrations/versions/0007_privileges.py for the rules.

-- -- the owner role ---------------------------------------------------------------------
-- Cluster-wide, like the other allocator roles; created once, kept while any database uses
-- it. Whoever runs the migrations must be a superuser or a member of it (ALTER ... OWNER TO
-- needs the membership, and so does every later migration that replaces a function).
-- pg_read_all_stats: replication_status() reads the details of pg_stat_replication (which
-- standbys a commit waits for), which PostgreSQL shows only to that role's members.
DO $owner$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'allocator_owner') THEN
        BEGIN
            CREATE ROLE allocator_owner NOLOGIN;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'role % may not create the role allocator_owner', current_user
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'run the migrations as a superuser or a role with CREATEROLE, or create allocator_owner (NOLOGIN) and GRANT it to the migration role first';
        END;
    END IF;
    IF NOT pg_has_role(current_user, 'allocator_owner', 'USAGE') THEN
        BEGIN
            EXECUTE format('GRANT allocator_owner TO %I', current_user);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'role % may not take the allocator schema''s ownership role', current_user
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'run the migrations as a superuser or as a member of allocator_owner (GRANT allocator_owner TO <migration role>)';
        END;
    END IF;
    IF NOT pg_has_role('allocator_owner', 'pg_read_all_stats', 'USAGE') THEN
        BEGIN
            GRANT pg_read_all_stats TO allocator_owner;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'role % may not grant pg_read_all_stats to allocator_owner', current_user
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'run the migrations as a superuser, or GRANT pg_read_all_stats TO allocator_owner first';
        END;
    END IF;
END
$owner$;

-- -- pool_status without helper grants --------------------------------------------------
-- A view reads its tables with its owner's rights but calls functions with the reader's:
-- pool_status used to need EXECUTE on available_blocks(), id_time_ms() and db_now_ms() for
-- every reader. Now the view calls one SECURITY DEFINER function that computes the row, and
-- the helpers are the owner's alone. Same columns, same values (the 0003 definition).
CREATE FUNCTION allocator.pool_status_row()
RETURNS TABLE (
    available_blocks bigint,
    available_ids bigint,
    claim_rate_blocks_per_s double precision,
    runway_s double precision,
    high_water_id bigint,
    cut_position bigint,
    claim_position bigint,
    epoch bigint,
    holder text,
    generation bigint,
    mark_ahead_ms bigint,
    mark_lead_ms bigint
)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
ROWS 1
AS $fn$
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
SELECT a.blocks,
       a.ids,
       r.blocks_per_s,
       CASE WHEN r.blocks_per_s > 0 THEN a.blocks / r.blocks_per_s END,
       h.last_id,
       h.last_ticket,
       p.claim_position,
       f.epoch,
       f.holder,
       f.generation,
       allocator.id_time_ms(h.last_id) - allocator.db_now_ms(),
       allocator.id_time_ms(h.last_id) - floor(extract(epoch FROM h.marked_at) * 1000)::bigint
  FROM allocator.available_blocks() a
 CROSS JOIN position p
 CROSS JOIN allocator.high_water h
 CROSS JOIN allocator.fence f
  LEFT JOIN rate r ON true;
$fn$;

COMMENT ON FUNCTION allocator.pool_status_row() IS
    'The one row of allocator.pool_status (the view calls it; read the view).';

CREATE OR REPLACE VIEW allocator.pool_status AS
SELECT s.available_blocks, s.available_ids, s.claim_rate_blocks_per_s, s.runway_s,
       s.high_water_id, s.cut_position, s.claim_position, s.epoch, s.holder, s.generation,
       s.mark_ahead_ms, s.mark_lead_ms
  FROM allocator.pool_status_row() s;

-- -- ownership ----------------------------------------------------------------------------
-- The schema first (the new owner needs CREATE on it), then every relation and routine.
-- Sequences owned by a column (identity) follow their table.
DO $own$
DECLARE
    obj record;
BEGIN
    ALTER SCHEMA allocator OWNER TO allocator_owner;
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
        EXECUTE format('ALTER %s %s OWNER TO allocator_owner',
                       CASE obj.relkind WHEN 'v' THEN 'VIEW'
                                        WHEN 'm' THEN 'MATERIALIZED VIEW'
                                        WHEN 'S' THEN 'SEQUENCE'
                                        WHEN 'f' THEN 'FOREIGN TABLE'
                                        ELSE 'TABLE' END,
                       obj.name);
    END LOOP;
    FOR obj IN
        SELECT p.oid::regprocedure AS name
          FROM pg_proc p
         WHERE p.pronamespace = 'allocator'::regnamespace
    LOOP
        EXECUTE format('ALTER ROUTINE %s OWNER TO allocator_owner', obj.name);
    END LOOP;
END
$own$;

-- Functions the owner creates later are not executable by PUBLIC (PostgreSQL's default is
-- EXECUTE for PUBLIC): a migration that forgets its REVOKE still exposes nothing.
ALTER DEFAULT PRIVILEGES FOR ROLE allocator_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- -- grants: exactly the table in docs/sql.md ---------------------------------------------
-- Everything is revoked first, so the result does not depend on what earlier revisions
-- granted.
REVOKE ALL ON SCHEMA allocator
    FROM PUBLIC, allocator_consumer, allocator_node, allocator_operator;
REVOKE ALL ON ALL TABLES IN SCHEMA allocator
    FROM PUBLIC, allocator_consumer, allocator_node, allocator_operator;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA allocator
    FROM PUBLIC, allocator_consumer, allocator_node, allocator_operator;
REVOKE ALL ON ALL ROUTINES IN SCHEMA allocator
    FROM PUBLIC, allocator_consumer, allocator_node, allocator_operator;

GRANT USAGE ON SCHEMA allocator TO allocator_consumer, allocator_node, allocator_operator;

-- Everyone who reads pool_status runs the function behind it.
GRANT SELECT ON allocator.pool_status TO allocator_consumer, allocator_node, allocator_operator;
GRANT EXECUTE ON FUNCTION allocator.pool_status_row()
    TO allocator_consumer, allocator_node, allocator_operator;

-- Consumers: claim. Nothing else.
GRANT EXECUTE ON FUNCTION allocator.claim_blocks(text, integer) TO allocator_consumer;

-- Nodes: the fenced writers, the probe, and the reads `run`, `status` and `fence status` make.
GRANT EXECUTE ON FUNCTION
    allocator.take_fence(bigint, bigint, text, text, integer, jsonb),
    allocator.cut_blocks(bigint, bigint, bigint[], bigint[], jsonb, bigint),
    allocator.requeue_stranded(bigint, bigint),
    allocator.prune_claimed(bigint, bigint, bigint, integer),
    allocator.end_term(bigint, bigint, text),
    allocator.record_pool_sample(),
    allocator.replication_status()
    TO allocator_node;
GRANT SELECT ON allocator.leader_history, allocator.fence_history TO allocator_node;

-- Operators: read everything worth reading; write only through the audited commands.
GRANT EXECUTE ON FUNCTION
    allocator.rebase_fence(text),
    allocator.reset_after_restore(text, bigint, bigint),
    allocator.replication_status()
    TO allocator_operator;
GRANT SELECT ON allocator.block_ledger, allocator.leader_history, allocator.fence_history,
    allocator.layout, allocator.fenced_writes, allocator.held_tickets, allocator.pool_resets
    TO allocator_operator;

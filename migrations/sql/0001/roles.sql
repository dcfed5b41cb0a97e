-- allocator schema 0001: roles and least-privilege grants.
-- Roles are cluster-wide NOLOGIN groups; operators create login users and grant membership,
-- e.g. CREATE ROLE orders_api LOGIN PASSWORD '...' IN ROLE allocator_consumer;

DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['allocator_consumer', 'allocator_node', 'allocator_operator'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
END
$roles$;

-- Nothing in the schema is reachable by PUBLIC; functions default to EXECUTE for PUBLIC.
REVOKE ALL ON SCHEMA allocator FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA allocator FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA allocator FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA allocator FROM PUBLIC;

GRANT USAGE ON SCHEMA allocator TO allocator_consumer, allocator_node, allocator_operator;

-- Consumers: claim, and look at the pool. Nothing else.
GRANT EXECUTE ON FUNCTION allocator.claim_blocks(text, integer) TO allocator_consumer;
GRANT SELECT ON allocator.pool_status TO allocator_consumer;
-- pool_status calls this read-only counter with the reader's privileges.
GRANT EXECUTE ON FUNCTION allocator.available_blocks()
    TO allocator_consumer, allocator_node, allocator_operator;

-- Nodes: take the fence, cut and requeue blocks, sample the pool, read what they report.
-- They never get INSERT/UPDATE on the tables: every write goes through the fenced functions.
GRANT EXECUTE ON FUNCTION allocator.take_fence(bigint, text, text, integer) TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.end_term(bigint, text) TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.cut_blocks(bigint, bigint[], bigint[]) TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.requeue_stranded(bigint) TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.record_pool_sample() TO allocator_node;
GRANT SELECT ON allocator.pool_status, allocator.block_ledger, allocator.leader_history
    TO allocator_node;

-- Operators: read the views.
GRANT SELECT ON allocator.pool_status, allocator.block_ledger, allocator.leader_history
    TO allocator_operator;

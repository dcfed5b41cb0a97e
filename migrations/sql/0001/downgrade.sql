-- allocator schema 0001, downgrade: drops the schema; drops the roles only when no other
-- database of the cluster still grants them anything (roles are cluster-wide).

DROP SCHEMA allocator CASCADE;

DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['allocator_consumer', 'allocator_node', 'allocator_operator'] LOOP
        BEGIN
            EXECUTE format('DROP ROLE IF EXISTS %I', r);
        EXCEPTION WHEN dependent_objects_still_exist THEN
            RAISE NOTICE 'role % kept: other databases still use it', r;
        END;
    END LOOP;
END
$roles$;

-- allocator schema 0002: retention of claimed blocks.
-- Executed by migrations/versions/0002_prune_claimed.py; its docstring argues why pruning
-- never weakens I1/I2.

-- Deletes at most p_limit blocks that were claimed before p_claimed_before, oldest claims
-- first; never an unclaimed block. Leader only, fenced exactly like cut_blocks (FOR SHARE on
-- the fence row at the caller's exact epoch, AL100 otherwise). Bad arguments raise AL103.
-- "Oldest first" walks the unique ticket index: tickets are drawn in claim order, so a
-- batch needs no sort of the whole table and no index on claimed_at (which would make
-- claims non-HOT updates); the cutoff itself is exact.
CREATE FUNCTION allocator.prune_claimed(p_epoch bigint, p_claimed_before timestamptz, p_limit integer)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    pruned integer;
BEGIN
    PERFORM allocator.lock_fence(p_epoch);
    IF p_claimed_before IS NULL OR p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'prune_claimed needs a cutoff time and a limit >= 1 (got %, %)',
            coalesce(p_claimed_before::text, 'NULL'), coalesce(p_limit::text, 'NULL')
            USING ERRCODE = 'AL103';
    END IF;

    -- Claimed rows are never updated again (claims only touch rows with claimed_at IS NULL,
    -- requeue_stranded likewise), so no lock is needed to pick them: a row this snapshot
    -- sees as claimed stays claimed.
    DELETE FROM allocator.blocks b
     WHERE b.block_id IN (
        SELECT o.block_id
          FROM allocator.blocks o
         WHERE o.claimed_at IS NOT NULL
           AND o.claimed_at < p_claimed_before
         ORDER BY o.ticket
         LIMIT p_limit);
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$fn$;

COMMENT ON FUNCTION allocator.prune_claimed(bigint, timestamptz, integer) IS
    'Retention (leader only, fenced): delete at most p_limit blocks claimed before '
    'p_claimed_before, oldest claims first; unclaimed blocks are never deleted.';

REVOKE ALL ON FUNCTION allocator.prune_claimed(bigint, timestamptz, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION allocator.prune_claimed(bigint, timestamptz, integer) TO allocator_node;

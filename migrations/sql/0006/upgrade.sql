-- 0006: the restore procedure, allocator.reset_after_restore(). See
-- migrations/versions/0006_reset_after_restore.py for the rules.

CREATE TABLE allocator.pool_resets (
    reset_id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reset_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    reset_by            text NOT NULL,
    reason              text NOT NULL,
    voided_blocks       bigint NOT NULL,
    old_high_water_id   bigint NOT NULL,
    new_high_water_id   bigint NOT NULL,
    old_generation      bigint NOT NULL,
    old_epoch           bigint NOT NULL,
    new_generation      bigint NOT NULL
);
COMMENT ON TABLE allocator.pool_resets IS
    'Every allocator pool reset --after-restore: who, when, why, what it voided and moved.';

CREATE FUNCTION allocator.reset_after_restore(
    p_reason text, p_min_high_water_id bigint, p_max_ahead_ms bigint
)
RETURNS TABLE (
    voided_blocks bigint,
    old_high_water_id bigint,
    new_high_water_id bigint,
    old_generation bigint,
    old_epoch bigint,
    new_generation bigint
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    prev      allocator.fence%ROWTYPE;
    mark      allocator.high_water%ROWTYPE;
    lay       allocator.cluster_layout%ROWTYPE;
    shift     integer;
    ahead_id  bigint := -1;
    new_mark  bigint;
    voided    bigint;
BEGIN
    IF p_reason IS NULL OR length(btrim(p_reason)) = 0 OR length(p_reason) > 1000 THEN
        RAISE EXCEPTION 'a pool reset needs a reason of 1..1000 characters'
            USING ERRCODE = 'AL106';
    END IF;
    IF p_min_high_water_id IS NULL OR p_min_high_water_id < -1
       OR p_max_ahead_ms IS NULL OR p_max_ahead_ms < 1 OR p_max_ahead_ms > 600000 THEN
        RAISE EXCEPTION 'a pool reset needs a high-water floor >= -1 and a lead of 1..600000 ms'
            USING ERRCODE = 'AL106';
    END IF;
    -- The fence first, as every writer takes it: no fenced write runs concurrently.
    SELECT * INTO prev FROM allocator.fence f FOR UPDATE;
    SELECT * INTO mark FROM allocator.high_water h FOR UPDATE;
    SELECT * INTO lay FROM allocator.cluster_layout l;

    -- Whatever was handed out after the restore point reads as unclaimed here: void it all.
    UPDATE allocator.blocks b
       SET claimed_by = 'allocator:voided-by-reset', claimed_at = clock_timestamp()
     WHERE b.claimed_at IS NULL;
    GET DIAGNOSTICS voided = ROW_COUNT;
    DELETE FROM allocator.held_tickets;

    -- Past every ID cut before the restore: no block was cut later than the database clock
    -- plus the allowed lead (AL105), nor past ZooKeeper's watermark.
    IF lay.epoch_ms IS NOT NULL THEN
        shift := lay.datacenter_bits + lay.lane_bits + lay.sequence_bits;
        ahead_id := ((allocator.db_now_ms() + p_max_ahead_ms - lay.epoch_ms + 1) << shift) - 1;
    END IF;
    new_mark := greatest(mark.last_id, p_min_high_water_id, ahead_id);
    UPDATE allocator.high_water h
       SET last_id = new_mark, marked_at = clock_timestamp(), updated_at = clock_timestamp();

    -- A new generation: no token from before the restore is accepted again.
    UPDATE allocator.fence f
       SET generation = prev.generation + 1, epoch = 0, holder = NULL, host = NULL, pid = NULL,
           taken_at = clock_timestamp();
    UPDATE allocator.leader_terms t
       SET ended_at = clock_timestamp(), end_reason = 'reset'
     WHERE t.ended_at IS NULL;
    INSERT INTO allocator.fence_rebases (rebased_by, old_generation, old_epoch, new_generation, reason)
    VALUES (session_user, prev.generation, prev.epoch, prev.generation + 1,
            'pool reset after restore: ' || p_reason);
    INSERT INTO allocator.pool_resets (reset_by, reason, voided_blocks, old_high_water_id,
                                       new_high_water_id, old_generation, old_epoch,
                                       new_generation)
    VALUES (session_user, p_reason, voided, mark.last_id, new_mark, prev.generation, prev.epoch,
            prev.generation + 1);
    RETURN QUERY SELECT voided, mark.last_id, new_mark, prev.generation, prev.epoch,
                        prev.generation + 1;
END
$fn$;

COMMENT ON FUNCTION allocator.reset_after_restore(text, bigint, bigint) IS
    'After a restore from a backup (or a failover that lost commits): void every unclaimed '
    'block, move the mark past db_now + p_max_ahead_ms and p_min_high_water_id (ZooKeeper''s '
    'watermark), advance the fence generation; recorded in pool_resets. Operator role.';

REVOKE ALL ON allocator.pool_resets FROM PUBLIC;
REVOKE ALL ON FUNCTION allocator.reset_after_restore(text, bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION allocator.reset_after_restore(text, bigint, bigint)
    TO allocator_operator;
GRANT SELECT ON allocator.pool_resets TO allocator_operator;

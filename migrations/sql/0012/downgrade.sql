-- allocator schema 0012 undone: the comment 0001 wrote.
COMMENT ON SCHEMA allocator IS 'Snowflake ID block allocator (see DESIGN.md section 6)';

-- cut_blocks with 0003's comment back.
CREATE OR REPLACE FUNCTION allocator.cut_blocks(p_generation bigint, p_epoch bigint, p_first_ids bigint[], p_last_ids bigint[], p_layout jsonb, p_max_ahead_ms bigint) RETURNS TABLE(high_water_id bigint, last_ticket bigint, lead_ms bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n           integer := coalesce(cardinality(p_first_ids), 0);
    lay         allocator.cluster_layout%ROWTYPE;
    mark        allocator.high_water%ROWTYPE;
    position    bigint;
    first_tk    bigint;
    shift       integer;
    db_now      timestamptz;
    now_ms      bigint;
    prev_lead   bigint := 0;
    allowed_ms  bigint;
    last_ms     bigint;
BEGIN
    PERFORM allocator.lock_fence(p_generation, p_epoch);
    IF n = 0 OR n <> coalesce(cardinality(p_last_ids), 0)
       OR array_ndims(p_first_ids) <> 1 OR array_ndims(p_last_ids) <> 1
       OR array_lower(p_first_ids, 1) <> 1 OR array_lower(p_last_ids, 1) <> 1 THEN
        RAISE EXCEPTION 'block batch must be two non-empty one-dimensional arrays of equal length, indexed from 1'
            USING ERRCODE = 'AL103';
    END IF;
    IF p_max_ahead_ms IS NULL OR p_max_ahead_ms < 0 THEN
        RAISE EXCEPTION 'max_ahead_ms must be >= 0 (got %)', coalesce(p_max_ahead_ms::text, 'NULL')
            USING ERRCODE = 'AL103';
    END IF;
    IF EXISTS (
        SELECT 1
          FROM (SELECT f, l, lag(l) OVER (ORDER BY o) AS prev_l
                  FROM unnest(p_first_ids, p_last_ids) WITH ORDINALITY AS u(f, l, o)) x
         WHERE x.f IS NULL OR x.l IS NULL OR x.l < x.f OR x.f <= x.prev_l OR x.f < 0
    ) THEN
        RAISE EXCEPTION 'block batch must be ascending, non-overlapping ranges with 0 <= first <= last'
            USING ERRCODE = 'AL103';
    END IF;
    lay := allocator.check_layout(p_layout, NULL);
    shift := lay.lane_bits + lay.sequence_bits;
    IF EXISTS (
        SELECT 1 FROM unnest(p_first_ids, p_last_ids) AS u(f, l)
         WHERE ((u.f >> shift) & ((1::bigint << lay.datacenter_bits) - 1)) <> lay.datacenter_id
            OR (u.f >> shift) <> (u.l >> shift)
    ) THEN
        RAISE EXCEPTION 'block outside datacenter % (or spanning two datacenter prefixes)', lay.datacenter_id
            USING ERRCODE = 'AL104';
    END IF;

    SELECT * INTO mark FROM allocator.high_water FOR UPDATE;
    IF p_first_ids[1] <= mark.last_id THEN
        RAISE EXCEPTION 'block % starts at or behind the high-water mark %', p_first_ids[1], mark.last_id
            USING ERRCODE = 'AL102';
    END IF;

    -- The clock rule (DESIGN section 5): the database clock is the reference.
    db_now := clock_timestamp();
    now_ms := floor(extract(epoch FROM db_now) * 1000)::bigint;
    IF mark.last_id >= 0 AND mark.marked_at IS NOT NULL THEN
        prev_lead := greatest(0, allocator.id_time_ms(mark.last_id)
                                 - floor(extract(epoch FROM mark.marked_at) * 1000)::bigint);
    END IF;
    allowed_ms := now_ms + greatest(p_max_ahead_ms, prev_lead);
    last_ms := allocator.id_time_ms(p_last_ids[n]);
    IF last_ms > allowed_ms THEN
        RAISE EXCEPTION 'clock ahead: block % carries % ms, % ms past the database clock; at most % ms allowed',
            p_last_ids[n], last_ms, last_ms - now_ms, greatest(p_max_ahead_ms, prev_lead)
            USING ERRCODE = 'AL105',
                  DETAIL = format('db_now_ms=%s allowed_ms=%s block_ms=%s', now_ms, allowed_ms, last_ms),
                  HINT = 'the node''s clock runs ahead of the database server''s';
    END IF;

    -- Tickets continue after every ticket already drawn, so a claim that drew a ticket too
    -- early (empty pool) never leaves a new block behind it.
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END INTO position
      FROM allocator.claim_ticket s;
    first_tk := greatest(mark.last_ticket, position) + 1;

    INSERT INTO allocator.blocks (ticket, first_id, last_id, generation, epoch, cut_at)
    SELECT first_tk + u.o - 1, u.f, u.l, p_generation, p_epoch, db_now
      FROM unnest(p_first_ids, p_last_ids) WITH ORDINALITY AS u(f, l, o);

    UPDATE allocator.high_water h
       SET last_id = p_last_ids[n], last_ticket = first_tk + n - 1, marked_at = db_now,
           updated_at = statement_timestamp();
    RETURN QUERY SELECT p_last_ids[n], first_tk + n - 1, greatest(0, last_ms - now_ms);
END
$$;

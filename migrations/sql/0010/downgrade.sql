-- 0010 downgrade: claims cannot be paused any more. claim_blocks and reset_after_restore as
-- 0008 and 0006 left them (CREATE OR REPLACE keeps their owner and grants), pool_status as
-- 0007 defined it (a view cannot lose a column in place: dropped and created again, given
-- to allocator_owner and granted as before), then the pause's objects go.

CREATE OR REPLACE FUNCTION allocator.claim_blocks(consumer text, n integer DEFAULT 1)
RETURNS TABLE (block_id bigint, first_id bigint, last_id bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    tickets     bigint[];
    claimed     integer;
    more        integer;
    one_tk      bigint;
    floor_tk    bigint;
    ceiling_tk  bigint;
    held        bigint[];
BEGIN
    -- Blank: nothing but white space or invisible characters (Unicode spaces, zero-width
    -- ones, the BOM), which would show as an empty name in the ledger.
    IF consumer IS NULL
       OR consumer ~ '^[[:space:]\u00a0\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u3000\ufeff]*$' THEN
        RAISE EXCEPTION 'consumer must be a non-empty name'
            USING ERRCODE = 'AL001', HINT = 'pass the application''s name, e.g. ''orders-api''';
    END IF;
    IF length(consumer) > 128 THEN
        RAISE EXCEPTION 'consumer name is % characters long; the maximum is 128', length(consumer)
            USING ERRCODE = 'AL001';
    END IF;
    IF consumer ~ '[[:cntrl:]\u2028\u2029]' THEN  -- C0, DEL, C1 and the Unicode line breaks
        RAISE EXCEPTION 'consumer name contains control characters' USING ERRCODE = 'AL001';
    END IF;
    IF n IS NULL OR n < 1 OR n > 1000 THEN
        RAISE EXCEPTION 'block count must be between 1 and 1000, got %', coalesce(n::text, 'NULL')
            USING ERRCODE = 'AL002';
    END IF;

    -- I4: the claim is durable whatever the caller's session says; local to this transaction.
    PERFORM set_config('synchronous_commit', 'on', true);
    -- A claim inside a transaction holds its block's row lock until that transaction ends.
    -- Bound how long it may sit idle: 60 s, unless the session already has a shorter bound.
    -- Local to this transaction (an autocommit claim is never idle; a role-level setting on
    -- the NOLOGIN group would not reach its members). The server ends an idle transaction
    -- past it (FATAL 25P03, the connection closes); the rolled-back block is requeued.
    IF current_setting('idle_in_transaction_session_timeout')::interval
       NOT BETWEEN interval '1 millisecond' AND interval '60 seconds' THEN
        PERFORM set_config('idle_in_transaction_session_timeout', '60s', true);
    END IF;

    -- Fast path: draw n tickets and claim the blocks that carry them, by unique index.
    -- SKIP LOCKED: a row held by someone else (requeue_stranded, or a slow-path claim in an
    -- open transaction) is skipped, never waited for; the slow path below makes up for it.
    -- n = 1 (the common call) avoids the array machinery: about twice the throughput.
    IF n = 1 THEN
        one_tk := nextval('allocator.claim_ticket');
        RETURN QUERY
        UPDATE allocator.blocks b
           SET claimed_by = consumer, claimed_at = statement_timestamp()
         WHERE b.ctid = (SELECT s.ctid FROM allocator.blocks s
                          WHERE s.ticket = one_tk AND s.claimed_at IS NULL
                            FOR UPDATE SKIP LOCKED)
        RETURNING b.block_id, b.first_id, b.last_id;
    ELSE
        SELECT array_agg(nextval('allocator.claim_ticket')) INTO tickets
          FROM generate_series(1, n);
        RETURN QUERY
        WITH mine AS (
            SELECT s.block_id FROM allocator.blocks s
             WHERE s.ticket = ANY (tickets) AND s.claimed_at IS NULL
               FOR UPDATE SKIP LOCKED
        ), won AS (
            UPDATE allocator.blocks b
               SET claimed_by = consumer, claimed_at = statement_timestamp()
              FROM mine m
             WHERE b.block_id = m.block_id
            RETURNING b.block_id, b.first_id, b.last_id
        )
        SELECT w.block_id, w.first_id, w.last_id FROM won w ORDER BY w.first_id;
    END IF;
    GET DIAGNOSTICS claimed = ROW_COUNT;

    IF claimed < n THEN
        -- Slow path: a ticket found no block (pool empty, a block still being cut, or moved
        -- by requeue_stranded). Take the oldest unheld blocks stranded below the ticket
        -- position: those whose claims rolled back. First the held tickets (below the
        -- floor, so the oldest; a few rows by primary key), then the window requeue_stranded
        -- considers next, (requeued_upto, requeue_mark]: tickets drawn before its previous
        -- run, so never one a claim in flight is about to take. SKIP LOCKED, so it never
        -- waits; a held block whose claim is still open is skipped, one that committed is
        -- claimed (claimed_at is rechecked under the lock).
        held := ARRAY(SELECT t.block_id FROM allocator.held_tickets t);
        IF cardinality(held) > 0 THEN
            RETURN QUERY
            WITH stranded AS (
                SELECT b.block_id
                  FROM allocator.blocks b
                 WHERE b.block_id = ANY (held)
                   AND b.claimed_at IS NULL
                 ORDER BY b.ticket
                 LIMIT n - claimed
                   FOR UPDATE SKIP LOCKED
            ), won AS (
                UPDATE allocator.blocks b
                   SET claimed_by = consumer, claimed_at = statement_timestamp()
                  FROM stranded s
                 WHERE b.block_id = s.block_id
                RETURNING b.block_id, b.first_id, b.last_id
            )
            SELECT w.block_id, w.first_id, w.last_id FROM won w ORDER BY w.first_id;
            GET DIAGNOSTICS more = ROW_COUNT;
            claimed := claimed + more;
        END IF;
    END IF;
    IF claimed < n THEN
        SELECT h.requeued_upto, h.requeue_mark INTO floor_tk, ceiling_tk
          FROM allocator.high_water h;
        RETURN QUERY
        WITH stranded AS (
            SELECT b.block_id
              FROM allocator.blocks b
             WHERE b.ticket > floor_tk
               AND b.ticket <= ceiling_tk
               AND b.claimed_at IS NULL
             ORDER BY b.ticket
             LIMIT n - claimed
               FOR UPDATE SKIP LOCKED
        ), won AS (
            UPDATE allocator.blocks b
               SET claimed_by = consumer, claimed_at = statement_timestamp()
              FROM stranded s
             WHERE b.block_id = s.block_id
            RETURNING b.block_id, b.first_id, b.last_id
        )
        SELECT w.block_id, w.first_id, w.last_id FROM won w ORDER BY w.first_id;
        GET DIAGNOSTICS more = ROW_COUNT;
        claimed := claimed + more;
    END IF;

    IF claimed = 0 THEN
        RAISE EXCEPTION 'pool empty: no ID block is available'
            USING ERRCODE = 'AL003',
                  HINT = 'the leader refills the pool; retry with backoff, and check allocator.pool_status';
    END IF;
END
$fn$;

COMMENT ON FUNCTION allocator.claim_blocks(text, integer) IS
    'Claim up to n (1..1000) ID blocks for consumer. Returns the blocks claimed (fewer than n '
    'only when the pool runs short); raises AL003 when none is available. Durable on return. '
    'Bounds the calling transaction''s idle time to 60 s (idle_in_transaction_session_timeout, '
    'transaction-local; a shorter session value is kept).';

CREATE OR REPLACE FUNCTION allocator.reset_after_restore(
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

DROP VIEW allocator.pool_status;
CREATE VIEW allocator.pool_status AS
SELECT s.available_blocks, s.available_ids, s.claim_rate_blocks_per_s, s.runway_s,
       s.high_water_id, s.cut_position, s.claim_position, s.epoch, s.holder, s.generation,
       s.mark_ahead_ms, s.mark_lead_ms
  FROM allocator.pool_status_row() s;
ALTER VIEW allocator.pool_status OWNER TO allocator_owner;
REVOKE ALL ON allocator.pool_status FROM PUBLIC;
GRANT SELECT ON allocator.pool_status TO allocator_consumer, allocator_node, allocator_operator;

DROP FUNCTION allocator.claims_in_flight();
DROP FUNCTION allocator.resume_claims(text);
DROP FUNCTION allocator.pause_claims(text);
DROP VIEW allocator.claim_pause_history;
DROP TABLE allocator.claim_pause;
DROP TABLE allocator.claim_pauses;

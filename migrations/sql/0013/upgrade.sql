-- 0013: a cheaper claim_blocks. See migrations/versions/0013_claim_path.py for the rules.
--
-- Expand-only: claim_blocks is replaced with its signature, result, owner and grants (CREATE
-- OR REPLACE keeps them); nothing is added or dropped. The same checks, errors, pause and
-- bound as 0011's, in the same order; two things cost less per claim:
--   * the pause flag and the bound on an ID's age are read in one statement, the bound
--     inline (age_bound_id(0, false)'s expression) instead of a nested PL/pgSQL call with a
--     SET clause of its own;
--   * synchronous_commit is set only when the caller's value is not 'on' already.
-- age_bound_id stays (claim_blocks_expiring and void_aged_blocks call it); its expression
-- and the one inlined here must stay the same (tests/integration/test_claim_path.py).

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
    pause       bigint;
    paused      allocator.claim_pauses%ROWTYPE;
    -- this migration: the bound (NULL: none in force) and the extra tickets drawn for
    -- aged blocks, at most max_extra per call (bounded work; the leader's job voids the rest)
    bound_id    bigint;
    max_extra   constant integer := 32;
    extra       integer := 0;
    want        integer;
    skipped     integer;
    r_id        bigint;
    r_first     bigint;
    r_last      bigint;
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
    -- This migration: 'allocator:' names the system's own voids in the ledger.
    IF left(consumer, 10) = 'allocator:' THEN
        RAISE EXCEPTION 'consumer names beginning with "allocator:" are reserved (voided blocks carry them)'
            USING ERRCODE = 'AL001', HINT = 'pass the application''s name, e.g. ''orders-api''';
    END IF;
    IF n IS NULL OR n < 1 OR n > 1000 THEN
        RAISE EXCEPTION 'block count must be between 1 and 1000, got %', coalesce(n::text, 'NULL')
            USING ERRCODE = 'AL002';
    END IF;

    -- Claims paused (migration 0010): see its notes. The flag is still read in a statement
    -- of its own after the lock is held; this migration reads the bound (0011) in that same
    -- statement, inline: the expression of age_bound_id(0, false), without its call.
    PERFORM pg_advisory_xact_lock_shared(1095520067, 4);
    IF current_setting('transaction_isolation') = 'read committed' THEN
        SELECT (SELECT p.pause_id FROM allocator.claim_pause p),
               (SELECT greatest(0, least(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
                                         - a.max_block_age_ms - l.epoch_ms,
                                         (1::bigint << l.timestamp_bits) - 1))
                       << (l.datacenter_bits + l.lane_bits + l.sequence_bits)
                  FROM (SELECT * FROM allocator.block_age LIMIT 1) a
                 CROSS JOIN (SELECT * FROM allocator.cluster_layout LIMIT 1) l
                 WHERE NOT a.serve_aged_without_leader
                    OR a.heartbeat_at >= clock_timestamp()
                                         - make_interval(secs => a.leader_stale_ms / 1000.0))
          INTO pause, bound_id;
    ELSE
        SELECT (SELECT p.pause_id FROM allocator.claim_pause p FOR SHARE),
               (SELECT greatest(0, least(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
                                         - a.max_block_age_ms - l.epoch_ms,
                                         (1::bigint << l.timestamp_bits) - 1))
                       << (l.datacenter_bits + l.lane_bits + l.sequence_bits)
                  FROM (SELECT * FROM allocator.block_age LIMIT 1) a
                 CROSS JOIN (SELECT * FROM allocator.cluster_layout LIMIT 1) l
                 WHERE NOT a.serve_aged_without_leader
                    OR a.heartbeat_at >= clock_timestamp()
                                         - make_interval(secs => a.leader_stale_ms / 1000.0))
          INTO pause, bound_id;
    END IF;
    IF pause IS NOT NULL THEN
        SELECT * INTO paused FROM allocator.claim_pauses c WHERE c.pause_id = pause;
        RAISE EXCEPTION 'claims paused: no ID block is handed out until an operator resumes claims'
            USING ERRCODE = 'AL004',
                  DETAIL = format('paused at %s', paused.paused_at),
                  HINT = 'retry with backoff, as after AL003; an operator resumes claims with allocator pool resume';
    END IF;

    -- I4: the claim is durable whatever the caller's session says; local to this transaction.
    -- Set only when not 'on' already (this migration): the same value at commit, without a
    -- GUC stack entry to push and unwind on every claim.
    IF current_setting('synchronous_commit') <> 'on' THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    -- Bound how long a claim inside a transaction may sit idle (migration 0008's notes).
    IF current_setting('idle_in_transaction_session_timeout')::interval
       NOT BETWEEN interval '1 millisecond' AND interval '60 seconds' THEN
        PERFORM set_config('idle_in_transaction_session_timeout', '60s', true);
    END IF;

    -- The bound (0011), read above with the flag: NULL without a block_age row (an older
    -- leader), or while no leader serves and aged blocks are served then.

    IF bound_id IS NULL THEN
        -- Fast path, as before: draw n tickets and claim the blocks that carry them, by
        -- unique index. SKIP LOCKED: a row held by someone else is skipped, never waited
        -- for; the slow path below makes up for it. n = 1 avoids the array machinery.
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
    ELSIF n = 1 THEN
        -- With a bound: a drawn block that is aged is voided (claimed by
        -- 'allocator:voided-aged', never handed out) and another ticket drawn, as is a
        -- ticket whose block the leader's job voided already; at most max_extra extra.
        claimed := 0;
        LOOP
            one_tk := nextval('allocator.claim_ticket');
            UPDATE allocator.blocks b
               SET claimed_by = CASE WHEN b.first_id < bound_id THEN 'allocator:voided-aged'
                                     ELSE consumer END,
                   claimed_at = CASE WHEN b.first_id < bound_id THEN clock_timestamp()
                                     ELSE statement_timestamp() END
             WHERE b.ctid = (SELECT s.ctid FROM allocator.blocks s
                              WHERE s.ticket = one_tk AND s.claimed_at IS NULL
                                FOR UPDATE SKIP LOCKED)
            RETURNING b.block_id, b.first_id, b.last_id INTO r_id, r_first, r_last;
            IF FOUND AND r_first >= bound_id THEN
                block_id := r_id;
                first_id := r_first;
                last_id := r_last;
                RETURN NEXT;
                claimed := 1;
                EXIT;
            END IF;
            IF NOT FOUND AND NOT EXISTS (
                SELECT 1 FROM allocator.blocks s
                 WHERE s.ticket = one_tk AND s.claimed_by = 'allocator:voided-aged') THEN
                EXIT;  -- no block, or one held by someone else: the slow path
            END IF;
            PERFORM nextval('allocator.voided_tickets');  -- this ticket drew a void
            extra := extra + 1;
            EXIT WHEN extra > max_extra;
        END LOOP;
    ELSE
        claimed := 0;
        want := n;
        LOOP
            SELECT array_agg(nextval('allocator.claim_ticket')) INTO tickets
              FROM generate_series(1, want);
            RETURN QUERY
            WITH mine AS (
                SELECT s.block_id FROM allocator.blocks s
                 WHERE s.ticket = ANY (tickets) AND s.claimed_at IS NULL
                   AND s.first_id >= bound_id
                   FOR UPDATE SKIP LOCKED
            ), won AS (
                UPDATE allocator.blocks b
                   SET claimed_by = consumer, claimed_at = statement_timestamp()
                  FROM mine m
                 WHERE b.block_id = m.block_id
                RETURNING b.block_id, b.first_id, b.last_id
            )
            SELECT w.block_id, w.first_id, w.last_id FROM won w ORDER BY w.first_id;
            GET DIAGNOSTICS more = ROW_COUNT;
            claimed := claimed + more;
            EXIT WHEN claimed >= n;
            UPDATE allocator.blocks b
               SET claimed_by = 'allocator:voided-aged', claimed_at = clock_timestamp()
             WHERE b.block_id IN (SELECT s.block_id FROM allocator.blocks s
                                   WHERE s.ticket = ANY (tickets) AND s.claimed_at IS NULL
                                     AND s.first_id < bound_id
                                     FOR UPDATE SKIP LOCKED);
            SELECT count(*) INTO skipped FROM allocator.blocks s
             WHERE s.ticket = ANY (tickets) AND s.claimed_by = 'allocator:voided-aged';
            PERFORM nextval('allocator.voided_tickets') FROM generate_series(1, skipped);
            want := least(skipped, max_extra - extra, n - claimed);
            EXIT WHEN want <= 0;
            extra := extra + want;
        END LOOP;
    END IF;

    IF claimed < n THEN
        -- Slow path (migration 0004): the oldest unheld blocks stranded below the ticket
        -- position, first the held tickets, then requeue_stranded's next window. Aged
        -- blocks are skipped while a bound is in force (the leader's job voids them).
        held := ARRAY(SELECT t.block_id FROM allocator.held_tickets t);
        IF cardinality(held) > 0 THEN
            RETURN QUERY
            WITH stranded AS (
                SELECT b.block_id
                  FROM allocator.blocks b
                 WHERE b.block_id = ANY (held)
                   AND b.claimed_at IS NULL
                   AND (bound_id IS NULL OR b.first_id >= bound_id)
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
               AND (bound_id IS NULL OR b.first_id >= bound_id)
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

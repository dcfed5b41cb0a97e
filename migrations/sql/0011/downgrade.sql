-- 0011 downgrade: no bound on an ID's age any more. claim_blocks as 0010 left it (CREATE OR
-- REPLACE keeps its owner and grants), then the bound's objects go.

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

    -- Claims paused (this migration): first the shared advisory lock that marks this
    -- transaction as a claim in flight until it ends (allocator.claims_in_flight() lists its
    -- holders; allocator pool pause waits for those it saw right after the pause committed),
    -- then, in a statement of its own, the flag. Its own statement: in READ COMMITTED every
    -- statement takes a new snapshot, so this one is taken after the lock is held, and a
    -- claim that took the lock after the pause committed always sees the pause. Under
    -- REPEATABLE READ or SERIALIZABLE the snapshot can be older than the lock: FOR SHARE
    -- then refuses a flag row changed since (SQLSTATE 40001, retryable) instead of reading
    -- an old "not paused" (FOR KEY SHARE would not: a pause changes no key). Nothing takes
    -- the advisory lock exclusively, so a READ COMMITTED claim never waits here.
    PERFORM pg_advisory_xact_lock_shared(1095520067, 4);
    IF current_setting('transaction_isolation') = 'read committed' THEN
        SELECT p.pause_id INTO pause FROM allocator.claim_pause p;
    ELSE
        SELECT p.pause_id INTO pause FROM allocator.claim_pause p FOR SHARE;
    END IF;
    IF pause IS NOT NULL THEN
        SELECT * INTO paused FROM allocator.claim_pauses c WHERE c.pause_id = pause;
        RAISE EXCEPTION 'claims paused: no ID block is handed out until an operator resumes claims'
            USING ERRCODE = 'AL004',
                  -- When only: who and why are the operators' (claim_pause_history), not
                  -- the consumers'.
                  DETAIL = format('paused at %s', paused.paused_at),
                  HINT = 'retry with backoff, as after AL003; an operator resumes claims with allocator pool resume';
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
    'only when the pool runs short); raises AL003 when none is available, AL004 while an '
    'operator has paused claims. Durable on return. Bounds the calling transaction''s idle '
    'time to 60 s (idle_in_transaction_session_timeout, transaction-local; a shorter session '
    'value is kept). Holds the shared advisory lock (1095520067, 4) until its transaction ends.';

-- pool_status_row as 0007 (and 0009's jit = off) left it, before its column goes.
CREATE OR REPLACE FUNCTION allocator.pool_status_row()
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
SET jit = off  -- migration 0009
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

ALTER TABLE allocator.pool_samples DROP COLUMN voided_position;
DROP FUNCTION allocator.voided_position();
DROP SEQUENCE allocator.voided_tickets;
DROP VIEW allocator.block_age_status;
DROP VIEW allocator.serving_history;
DROP FUNCTION allocator.block_age_status_row();
DROP FUNCTION allocator.claimed_block_ages(bigint, bigint, integer);
DROP FUNCTION allocator.claim_blocks_expiring(text, integer);
DROP FUNCTION allocator.leader_heartbeat(bigint, bigint, bigint, boolean, bigint);
DROP FUNCTION allocator.void_aged_blocks(bigint, bigint, bigint, integer);
DROP FUNCTION allocator.age_bound_id(bigint, boolean);
DROP TABLE allocator.serving_stretches;
DROP TABLE allocator.block_age;

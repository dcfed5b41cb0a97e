-- 0010: operators pause claims. See migrations/versions/0010_claim_pause.py for the rules.
--
-- New SQLSTATE (docs/sql.md): AL004 claims paused (consumers: retry with backoff, as AL003).
-- Expand-only: new tables, view and functions; claim_blocks and reset_after_restore are
-- replaced with their signatures and return types; pool_status gains one column at its end.

-- -- the flag and its record ------------------------------------------------------------------

-- Every pause, one row each: who paused claims, when and why, and who resumed them.
CREATE TABLE allocator.claim_pauses (
    pause_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    paused_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    paused_by      text NOT NULL,
    reason         text NOT NULL,
    resumed_at     timestamptz,
    resumed_by     text,
    resume_reason  text,
    CONSTRAINT claim_pauses_resume_complete
        CHECK ((resumed_at IS NULL) = (resumed_by IS NULL)
               AND (resumed_at IS NULL) = (resume_reason IS NULL))
);
-- At most one pause is open.
CREATE UNIQUE INDEX claim_pauses_one_open ON allocator.claim_pauses ((true))
    WHERE resumed_at IS NULL;
COMMENT ON TABLE allocator.claim_pauses IS
    'Every allocator pool pause / resume (and pool reset --after-restore): who, when, why.';

-- The flag claim_blocks reads: one row; pause_id is the open pause while claims are paused.
CREATE TABLE allocator.claim_pause (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    paused     boolean NOT NULL DEFAULT false,
    pause_id   bigint REFERENCES allocator.claim_pauses (pause_id),
    CONSTRAINT claim_pause_open CHECK (paused = (pause_id IS NOT NULL))
);
INSERT INTO allocator.claim_pause DEFAULT VALUES;
COMMENT ON TABLE allocator.claim_pause IS
    'Whether claims are paused (one row); written only by pause_claims, resume_claims and '
    'reset_after_restore.';

CREATE VIEW allocator.claim_pause_history AS
SELECT c.pause_id, c.paused_at, c.paused_by, c.reason, c.resumed_at, c.resumed_by,
       c.resume_reason
  FROM allocator.claim_pauses c;

-- -- claim_blocks: AL004 while paused ------------------------------------------------------
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

-- -- the operator's functions -------------------------------------------------------------

-- Pause claims: records who, when and why, and sets the flag. Claims that read the flag from
-- now on get AL004; claims already past that read finish (allocator pool pause waits for them
-- with claims_in_flight()). Pausing paused claims changes nothing and returns the open pause
-- with already_paused = true.
CREATE FUNCTION allocator.pause_claims(p_reason text)
RETURNS TABLE (
    pause_id bigint,
    paused_at timestamptz,
    paused_by text,
    reason text,
    already_paused boolean
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    open_pause bigint;
    already    boolean := true;
BEGIN
    IF p_reason IS NULL OR length(btrim(p_reason)) = 0 OR length(p_reason) > 1000 THEN
        RAISE EXCEPTION 'a pause needs a reason of 1..1000 characters' USING ERRCODE = 'AL106';
    END IF;
    -- Waits only for REPEATABLE READ claims holding the row FOR SHARE (claims in flight).
    SELECT p.pause_id INTO open_pause FROM allocator.claim_pause p FOR NO KEY UPDATE;
    IF open_pause IS NULL THEN
        INSERT INTO allocator.claim_pauses AS c (paused_by, reason)
        VALUES (session_user, p_reason)
        RETURNING c.pause_id INTO open_pause;
        UPDATE allocator.claim_pause p SET paused = true, pause_id = open_pause;
        already := false;
    END IF;
    RETURN QUERY
    SELECT c.pause_id, c.paused_at, c.paused_by, c.reason, already
      FROM allocator.claim_pauses c
     WHERE c.pause_id = open_pause;
END
$fn$;

COMMENT ON FUNCTION allocator.pause_claims(text) IS
    'Pause claims (claim_blocks answers AL004), recorded in claim_pause_history; returns the '
    'open pause, already_paused when claims were paused before. Operator role.';

-- Resume claims: closes the open pause with who, when and why, and clears the flag. Resuming
-- claims that are not paused changes nothing and returns one row with was_paused = false.
CREATE FUNCTION allocator.resume_claims(p_reason text)
RETURNS TABLE (
    pause_id bigint,
    paused_at timestamptz,
    paused_by text,
    reason text,
    resumed_at timestamptz,
    resumed_by text,
    resume_reason text,
    was_paused boolean
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    open_pause bigint;
BEGIN
    IF p_reason IS NULL OR length(btrim(p_reason)) = 0 OR length(p_reason) > 1000 THEN
        RAISE EXCEPTION 'a resume needs a reason of 1..1000 characters' USING ERRCODE = 'AL106';
    END IF;
    SELECT p.pause_id INTO open_pause FROM allocator.claim_pause p FOR NO KEY UPDATE;
    IF open_pause IS NULL THEN
        RETURN QUERY SELECT NULL::bigint, NULL::timestamptz, NULL::text, NULL::text,
                            NULL::timestamptz, NULL::text, NULL::text, false;
        RETURN;
    END IF;
    UPDATE allocator.claim_pause p SET paused = false, pause_id = NULL;
    RETURN QUERY
    UPDATE allocator.claim_pauses c
       SET resumed_at = clock_timestamp(), resumed_by = session_user, resume_reason = p_reason
     WHERE c.pause_id = open_pause
    RETURNING c.pause_id, c.paused_at, c.paused_by, c.reason, c.resumed_at, c.resumed_by,
              c.resume_reason, true;
END
$fn$;

COMMENT ON FUNCTION allocator.resume_claims(text) IS
    'Resume claims paused by pause_claims (or by reset_after_restore), recorded in '
    'claim_pause_history; was_paused = false when they were not paused. Operator role.';

-- The sessions whose transaction is a claim in flight: they hold claim_blocks' shared
-- advisory lock (1095520067, 4) until they commit or roll back. Not the caller's own.
CREATE FUNCTION allocator.claims_in_flight()
RETURNS TABLE (
    pid integer,
    virtualtransaction text,
    usename text,
    application_name text,
    client_addr inet,
    state text,
    xact_start timestamptz,
    state_change timestamptz
)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT l.pid, l.virtualtransaction, a.usename::text, a.application_name, a.client_addr,
           a.state, a.xact_start, a.state_change
      FROM pg_locks l
      LEFT JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE l.locktype = 'advisory'
       AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
       AND l.classid = 1095520067::oid AND l.objid = 4::oid AND l.objsubid = 2
       AND l.granted
       AND l.pid IS DISTINCT FROM pg_backend_pid()
     ORDER BY a.xact_start NULLS LAST, l.pid;
$fn$;

COMMENT ON FUNCTION allocator.claims_in_flight() IS
    'Sessions holding claim_blocks'' shared advisory lock (1095520067, 4): a claim in their '
    'open transaction. allocator pool pause waits until those it saw after pausing are gone. '
    'Operator role.';

-- -- the restore procedure: a reset database starts paused ---------------------------------
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
    open_pause bigint;
    new_pause bigint;
BEGIN
    IF p_reason IS NULL OR length(btrim(p_reason)) = 0 OR length(p_reason) > 1000 THEN
        RAISE EXCEPTION 'a pool reset needs a reason of 1..1000 characters'
            USING ERRCODE = 'AL106';
    END IF;
    IF p_min_high_water_id IS NULL OR p_min_high_water_id < -1
       OR p_max_ahead_ms IS NULL OR p_max_ahead_ms < 1 OR p_max_ahead_ms > 3600000 THEN
        -- Up to an hour: pool.max_clock_ahead_ms (at most 600000) plus the watermark's lag.
        RAISE EXCEPTION 'a pool reset needs a high-water floor >= -1 and a lead of 1..3600000 ms'
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
    -- The restored database starts paused (this migration): consumers get AL004 until an
    -- operator resumes claims, the last step of the procedure (docs/postgres-ha.md). A pause
    -- the backup held is closed and a new one opened, so the record says why it is paused now.
    SELECT p.pause_id INTO open_pause FROM allocator.claim_pause p FOR NO KEY UPDATE;
    IF open_pause IS NOT NULL THEN
        UPDATE allocator.claim_pauses c
           SET resumed_at = clock_timestamp(), resumed_by = session_user,
               resume_reason = 'superseded by a pool reset after restore'
         WHERE c.pause_id = open_pause;
    END IF;
    INSERT INTO allocator.claim_pauses AS c (paused_by, reason)
    VALUES (session_user, 'pool reset after restore: ' || p_reason)
    RETURNING c.pause_id INTO new_pause;
    UPDATE allocator.claim_pause p SET paused = true, pause_id = new_pause;
    INSERT INTO allocator.pool_resets (reset_by, reason, voided_blocks, old_high_water_id,
                                       new_high_water_id, old_generation, old_epoch,
                                       new_generation)
    VALUES (session_user, p_reason, voided, mark.last_id, new_mark, prev.generation, prev.epoch,
            prev.generation + 1);
    RETURN QUERY SELECT voided, mark.last_id, new_mark, prev.generation, prev.epoch,
                        prev.generation + 1;
END
$fn$;

-- -- pool_status: whether claims are paused, as a last column ----------------------------
-- The view reads the flag with its owner's rights: no reader needs a new grant.
CREATE OR REPLACE VIEW allocator.pool_status AS
SELECT s.available_blocks, s.available_ids, s.claim_rate_blocks_per_s, s.runway_s,
       s.high_water_id, s.cut_position, s.claim_position, s.epoch, s.holder, s.generation,
       s.mark_ahead_ms, s.mark_lead_ms, p.paused AS claims_paused
  FROM allocator.pool_status_row() s
 CROSS JOIN allocator.claim_pause p;

-- -- owner and grants (docs/sql.md, "Roles and privileges") --------------------------------
ALTER TABLE allocator.claim_pauses OWNER TO allocator_owner;
ALTER TABLE allocator.claim_pause OWNER TO allocator_owner;
ALTER VIEW allocator.claim_pause_history OWNER TO allocator_owner;
ALTER FUNCTION allocator.pause_claims(text) OWNER TO allocator_owner;
ALTER FUNCTION allocator.resume_claims(text) OWNER TO allocator_owner;
ALTER FUNCTION allocator.claims_in_flight() OWNER TO allocator_owner;

REVOKE ALL ON allocator.claim_pauses, allocator.claim_pause, allocator.claim_pause_history
    FROM PUBLIC;
REVOKE ALL ON FUNCTION allocator.pause_claims(text), allocator.resume_claims(text),
    allocator.claims_in_flight()
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION allocator.pause_claims(text), allocator.resume_claims(text),
    allocator.claims_in_flight()
    TO allocator_operator;
GRANT SELECT ON allocator.claim_pause_history TO allocator_node, allocator_operator;

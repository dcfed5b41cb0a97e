-- 0011: a bound on an ID's age. See migrations/versions/0011_block_age.py for the rules.
--
-- Expand-only: new tables, views and functions; claim_blocks is replaced with its signature
-- and result. Without a block_age row (no leader of this release has written a heartbeat
-- yet) claim_blocks behaves exactly as 0010's.

-- -- the bound and the leader's heartbeat ------------------------------------------------------

-- One row, written only by leader_heartbeat: the leader's settings and when it last wrote.
-- "A leader serves" = the row exists and heartbeat_at >= clock_timestamp() - leader_stale_ms.
CREATE TABLE allocator.block_age (
    singleton                  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    max_block_age_ms           bigint NOT NULL CHECK (max_block_age_ms >= 1),
    serve_aged_without_leader  boolean NOT NULL,
    leader_stale_ms            bigint NOT NULL CHECK (leader_stale_ms >= 1),
    heartbeat_at               timestamptz NOT NULL,
    generation                 bigint NOT NULL,
    epoch                      bigint NOT NULL
);
COMMENT ON TABLE allocator.block_age IS
    'The bound on an ID''s age and the leader''s heartbeat (one row; leader_heartbeat writes it).';

-- Every stretch of heartbeats, one row each: a heartbeat extends the newest stretch when it
-- comes from the same token with the same settings no later than leader_stale_ms / 2 after
-- the one before, and opens a new stretch otherwise. So between first_at and
-- last_at + leader_stale_ms a leader served, as claim_blocks judged it (the checker's input).
CREATE TABLE allocator.serving_stretches (
    stretch_id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    generation                 bigint NOT NULL,
    epoch                      bigint NOT NULL,
    max_block_age_ms           bigint NOT NULL,
    serve_aged_without_leader  boolean NOT NULL,
    leader_stale_ms            bigint NOT NULL,
    first_at                   timestamptz NOT NULL,
    last_at                    timestamptz NOT NULL,
    heartbeats                 bigint NOT NULL DEFAULT 1,
    CONSTRAINT serving_stretches_ordered CHECK (last_at >= first_at)
);
COMMENT ON TABLE allocator.serving_stretches IS
    'Stretches of leader heartbeats (leader_heartbeat): when a leader served, with its bound.';

CREATE VIEW allocator.serving_history AS
SELECT s.stretch_id, s.generation, s.epoch, s.max_block_age_ms, s.serve_aged_without_leader,
       s.leader_stale_ms, s.first_at, s.last_at, s.heartbeats
  FROM allocator.serving_stretches s;

-- Claim tickets drawn for voided blocks (by claim_blocks and by void_aged_blocks), so the
-- claim rate counts hand-outs only: a void is not demand, and a rate that counted voids
-- would size the pool by them, cut blocks that age out, void them again, and never shrink.
-- A sequence: non-transactional like claim_ticket itself (a ticket drawn by a claim that
-- rolls back stays drawn, and so does its count).
CREATE SEQUENCE allocator.voided_tickets AS bigint;

CREATE FUNCTION allocator.voided_position()
RETURNS bigint
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END FROM allocator.voided_tickets s;
$fn$;

-- Every sample records the count beside the claim position, whoever inserts it (an older
-- node's record_pool_sample names only its two columns: the default fills this one).
ALTER TABLE allocator.pool_samples
    ADD COLUMN voided_position bigint NOT NULL DEFAULT allocator.voided_position();

-- The lowest first ID that is not aged now, or NULL when no bound is in force (no
-- block_age row, or no layout recorded, or no leader serves and aged blocks are served
-- then). Aged: the first ID's millisecond lies more than max_block_age_ms - p_ahead_ms
-- behind the database clock, i.e. first_id < (that millisecond - epoch) << shift: a range
-- test on the unique index of first_id. p_ahead_ms: 0 for claims, the job's lead for voids
-- (p_always: in force whatever the heartbeat, as the leader's job needs). LIMIT 1: the planner
-- has no statistics on these one-row tables and would guess a cross join of ~800k rows,
-- costly enough to compile with JIT on every claim (~6 ms). PL/pgSQL, not SQL: a SQL
-- function called from claim_blocks is parsed and planned again on every call (and so is
-- db_now_ms inside it), which cost a claim ~0.15 ms here; PL/pgSQL keeps the plan for the
-- session. The clock expression is db_now_ms()'s.
CREATE FUNCTION allocator.age_bound_id(p_ahead_ms bigint DEFAULT 0, p_always boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    bound_id  bigint;
BEGIN
    SELECT greatest(0, least(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
                             - (a.max_block_age_ms - p_ahead_ms) - l.epoch_ms,
                             (1::bigint << l.timestamp_bits) - 1))
           << (l.datacenter_bits + l.lane_bits + l.sequence_bits)
      INTO bound_id
      FROM (SELECT * FROM allocator.block_age LIMIT 1) a
     CROSS JOIN (SELECT * FROM allocator.cluster_layout LIMIT 1) l
     WHERE p_always
        OR NOT a.serve_aged_without_leader
        OR a.heartbeat_at >= clock_timestamp() - make_interval(secs => a.leader_stale_ms / 1000.0);
    RETURN bound_id;
END
$fn$;

-- -- claim_blocks: never an aged block while a bound is in force ---------------------------------
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

    -- Claims paused (migration 0010): see its notes.
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
                  DETAIL = format('paused at %s', paused.paused_at),
                  HINT = 'retry with backoff, as after AL003; an operator resumes claims with allocator pool resume';
    END IF;

    -- I4: the claim is durable whatever the caller's session says; local to this transaction.
    PERFORM set_config('synchronous_commit', 'on', true);
    -- Bound how long a claim inside a transaction may sit idle (migration 0008's notes).
    IF current_setting('idle_in_transaction_session_timeout')::interval
       NOT BETWEEN interval '1 millisecond' AND interval '60 seconds' THEN
        PERFORM set_config('idle_in_transaction_session_timeout', '60s', true);
    END IF;

    -- The bound (this migration), read once per call: NULL without a block_age row (an
    -- older leader), or while no leader serves and aged blocks are served then.
    bound_id := allocator.age_bound_id();

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

COMMENT ON FUNCTION allocator.claim_blocks(text, integer) IS
    'Claim up to n (1..1000) ID blocks for consumer. Returns the blocks claimed (fewer than n '
    'only when the pool runs short); raises AL003 when none is available, AL004 while an '
    'operator has paused claims. Durable on return. Bounds the calling transaction''s idle '
    'time to 60 s (idle_in_transaction_session_timeout, transaction-local; a shorter session '
    'value is kept). Holds the shared advisory lock (1095520067, 4) until its transaction ends. '
    'While a bound on an ID''s age is in force (allocator.block_age_status) it hands out no '
    'block whose first ID is older than max_block_age_ms.';

-- claim_blocks plus, per block, the milliseconds until its first ID passes the bound (NULL
-- while no bound is in force), read right after the claim: what a client buffering IDs
-- needs to drop them in time. Same rules and errors as claim_blocks (it is called).
CREATE FUNCTION allocator.claim_blocks_expiring(consumer text, n integer DEFAULT 1)
RETURNS TABLE (block_id bigint, first_id bigint, last_id bigint, expires_in_ms bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    got       record;
    claimed   bigint[] := '{}';
    firsts    bigint[] := '{}';
    lasts     bigint[] := '{}';
    max_age   bigint;
    bound_id  bigint;
BEGIN
    FOR got IN SELECT * FROM allocator.claim_blocks(consumer, n) LOOP
        claimed := claimed || got.block_id;
        firsts := firsts || got.first_id;
        lasts := lasts || got.last_id;
    END LOOP;
    bound_id := allocator.age_bound_id();
    IF bound_id IS NOT NULL THEN
        SELECT a.max_block_age_ms INTO max_age FROM allocator.block_age a;
    END IF;
    RETURN QUERY
    SELECT c.b, c.f, c.l,
           CASE WHEN bound_id IS NOT NULL
                THEN allocator.id_time_ms(c.f) + max_age - allocator.db_now_ms() END
      FROM unnest(claimed, firsts, lasts) AS c(b, f, l)
     ORDER BY c.f;
END
$fn$;

COMMENT ON FUNCTION allocator.claim_blocks_expiring(text, integer) IS
    'claim_blocks, plus expires_in_ms per block: milliseconds (database clock) until its first '
    'ID passes the bound on an ID''s age; NULL while no bound is in force.';

-- -- the leader's writes -------------------------------------------------------------------------

-- Fenced: records that the leader serves, with its settings, at clock_timestamp(); extends
-- or opens a serving stretch. Returns the heartbeat's time.
CREATE FUNCTION allocator.leader_heartbeat(p_generation bigint, p_epoch bigint,
                                           p_max_block_age_ms bigint,
                                           p_serve_aged_without_leader boolean,
                                           p_leader_stale_ms bigint)
RETURNS timestamptz
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    prev   allocator.block_age%ROWTYPE;
    beat   timestamptz;
BEGIN
    PERFORM allocator.lock_fence(p_generation, p_epoch);
    IF p_max_block_age_ms IS NULL OR p_max_block_age_ms < 1
       OR p_leader_stale_ms IS NULL OR p_leader_stale_ms < 1
       OR p_serve_aged_without_leader IS NULL THEN
        RAISE EXCEPTION 'leader_heartbeat needs a max_block_age_ms >= 1, a leader_stale_ms >= 1 and serve_aged_without_leader (got %, %, %)',
            coalesce(p_max_block_age_ms::text, 'NULL'), coalesce(p_leader_stale_ms::text, 'NULL'),
            coalesce(p_serve_aged_without_leader::text, 'NULL')
            USING ERRCODE = 'AL103';
    END IF;
    SELECT * INTO prev FROM allocator.block_age a FOR UPDATE;
    beat := clock_timestamp();
    INSERT INTO allocator.block_age AS a (max_block_age_ms, serve_aged_without_leader,
                                          leader_stale_ms, heartbeat_at, generation, epoch)
    VALUES (p_max_block_age_ms, p_serve_aged_without_leader, p_leader_stale_ms, beat,
            p_generation, p_epoch)
    ON CONFLICT (singleton) DO UPDATE
       SET max_block_age_ms = excluded.max_block_age_ms,
           serve_aged_without_leader = excluded.serve_aged_without_leader,
           leader_stale_ms = excluded.leader_stale_ms,
           heartbeat_at = excluded.heartbeat_at,
           generation = excluded.generation,
           epoch = excluded.epoch;
    IF prev.singleton IS NOT NULL
       AND (prev.generation, prev.epoch, prev.max_block_age_ms, prev.serve_aged_without_leader,
            prev.leader_stale_ms)
           = (p_generation, p_epoch, p_max_block_age_ms, p_serve_aged_without_leader,
              p_leader_stale_ms)
       AND prev.heartbeat_at >= beat - make_interval(secs => p_leader_stale_ms / 2000.0) THEN
        UPDATE allocator.serving_stretches s
           SET last_at = beat, heartbeats = s.heartbeats + 1
         WHERE s.stretch_id = (SELECT max(o.stretch_id) FROM allocator.serving_stretches o);
    ELSE
        INSERT INTO allocator.serving_stretches (generation, epoch, max_block_age_ms,
                                                 serve_aged_without_leader, leader_stale_ms,
                                                 first_at, last_at)
        VALUES (p_generation, p_epoch, p_max_block_age_ms, p_serve_aged_without_leader,
                p_leader_stale_ms, beat, beat);
    END IF;
    RETURN beat;
END
$fn$;

COMMENT ON FUNCTION allocator.leader_heartbeat(bigint, bigint, bigint, boolean, bigint) IS
    'Fenced: the leader serves, with this bound on an ID''s age (allocator.block_age). Node role.';

-- Fenced: voids (claimed_by 'allocator:voided-aged', claimed_at clock_timestamp()) at most
-- p_limit unclaimed blocks whose first ID lies more than max_block_age_ms - p_ahead_ms behind
-- the database clock, oldest first, then draws the claim tickets up to the first block still
-- unclaimed, so claims do not draw voided tickets. Returns how many it voided. Unclaimed
-- blocks are those above the requeue floor plus the held ones (available_blocks' rule), so
-- the scan never walks the claimed history; rows a claim holds are skipped.
CREATE FUNCTION allocator.void_aged_blocks(p_generation bigint, p_epoch bigint,
                                           p_ahead_ms bigint, p_limit integer)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off  -- the unclaimed blocks are a narrow ticket range (available_blocks)
SET jit = off
AS $fn$
DECLARE
    max_age     bigint;
    below_id    bigint;
    floor_tk    bigint;
    voided      bigint;
    last_tk     bigint;
    position    bigint;
    next_fresh  bigint;
    target      bigint;
    drawn       bigint;
BEGIN
    PERFORM allocator.lock_fence(p_generation, p_epoch);
    SELECT a.max_block_age_ms INTO max_age FROM allocator.block_age a;
    IF p_ahead_ms IS NULL OR p_ahead_ms < 0 OR p_limit IS NULL OR p_limit < 1
       OR (max_age IS NOT NULL AND p_ahead_ms >= max_age) THEN
        RAISE EXCEPTION 'void_aged_blocks needs 0 <= ahead_ms < max_block_age_ms (%) and a limit >= 1 (got %, %)',
            coalesce(max_age::text, 'no bound yet'), coalesce(p_ahead_ms::text, 'NULL'),
            coalesce(p_limit::text, 'NULL')
            USING ERRCODE = 'AL103';
    END IF;
    below_id := allocator.age_bound_id(p_ahead_ms, true);
    IF below_id IS NULL THEN  -- no heartbeat yet, or no layout recorded
        RETURN 0;
    END IF;
    SELECT h.requeued_upto INTO floor_tk FROM allocator.high_water h;
    WITH candidates AS (
        SELECT b.block_id, b.first_id FROM allocator.blocks b
         WHERE b.ticket > floor_tk AND b.claimed_at IS NULL AND b.first_id < below_id
        UNION
        SELECT b.block_id, b.first_id FROM allocator.blocks b
         WHERE b.block_id = ANY (ARRAY(SELECT t.block_id FROM allocator.held_tickets t))
           AND b.claimed_at IS NULL AND b.first_id < below_id
    ), aged AS (
        SELECT b.block_id FROM allocator.blocks b
         WHERE b.block_id IN (SELECT c.block_id FROM candidates c
                               ORDER BY c.first_id LIMIT p_limit)
           AND b.claimed_at IS NULL
           FOR UPDATE SKIP LOCKED
    ), done AS (
        UPDATE allocator.blocks b
           SET claimed_by = 'allocator:voided-aged', claimed_at = clock_timestamp()
          FROM aged g
         WHERE b.block_id = g.block_id
        RETURNING b.ticket
    )
    SELECT count(*), max(d.ticket) INTO voided, last_tk FROM done d;

    IF voided > 0 THEN
        -- Draw the tickets of the voided blocks at the head of the queue, up to the first
        -- block still unclaimed (never past it: that one is a claim's to draw). nextval, not
        -- setval: claims draw concurrently, and the sequence must never move back.
        SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END INTO position
          FROM allocator.claim_ticket s;
        SELECT min(b.ticket) INTO next_fresh FROM allocator.blocks b
         WHERE b.ticket > position AND b.claimed_at IS NULL;
        target := CASE WHEN next_fresh IS NULL THEN last_tk ELSE least(last_tk, next_fresh - 1) END;
        IF target > position THEN
            LOOP
                drawn := nextval('allocator.claim_ticket');
                PERFORM nextval('allocator.voided_tickets');
                EXIT WHEN drawn >= target;
            END LOOP;
        END IF;
    END IF;
    RETURN voided;
END
$fn$;

COMMENT ON FUNCTION allocator.void_aged_blocks(bigint, bigint, bigint, integer) IS
    'Fenced: voids at most p_limit unclaimed blocks older than max_block_age_ms - p_ahead_ms, '
    'oldest first, and moves the claim tickets past them. Node role.';

-- -- what operators and applications read ------------------------------------------------------

-- pool_status: the claim rate counts hand-outs only, voids left out (allocator.voided_tickets).
-- Same columns; claim_position still counts every ticket drawn.
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
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END AS claim_position,
           allocator.voided_position() AS voided_position
      FROM allocator.claim_ticket s
), rate AS (
    SELECT ((p.claim_position - p.voided_position)
            - (s.claim_position - s.voided_position))::double precision
           / extract(epoch FROM clock_timestamp() - s.sampled_at)::double precision
           AS blocks_per_s
      FROM position p,
           LATERAL (SELECT ps.claim_position, ps.voided_position, ps.sampled_at
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

-- The one row of block_age_status (the view calls it, as pool_status calls pool_status_row).
-- Always one row: NULL settings before a leader of this release wrote a heartbeat.
CREATE FUNCTION allocator.block_age_status_row()
RETURNS TABLE (
    max_block_age_ms bigint,
    serve_aged_without_leader boolean,
    heartbeat_at timestamptz,
    leader_serves boolean,
    oldest_unclaimed_age_ms bigint
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
ROWS 1
AS $fn$
DECLARE
    floor_tk  bigint;
    oldest    bigint;
BEGIN
    SELECT w.requeued_upto INTO floor_tk FROM allocator.high_water w;
    SELECT least(
               (SELECT min(b.first_id) FROM allocator.blocks b
                 WHERE b.ticket > floor_tk AND b.claimed_at IS NULL),
               (SELECT min(b.first_id) FROM allocator.blocks b
                 WHERE b.block_id = ANY (ARRAY(SELECT t.block_id FROM allocator.held_tickets t))
                   AND b.claimed_at IS NULL))
      INTO oldest;
    RETURN QUERY
    SELECT a.max_block_age_ms, a.serve_aged_without_leader, a.heartbeat_at,
           coalesce(a.heartbeat_at >= clock_timestamp()
                                      - make_interval(secs => a.leader_stale_ms / 1000.0), false),
           allocator.db_now_ms() - allocator.id_time_ms(oldest)
      FROM (SELECT true) one
      LEFT JOIN allocator.block_age a ON true;
END
$fn$;

COMMENT ON FUNCTION allocator.block_age_status_row() IS
    'The one row of allocator.block_age_status (the view calls it; read the view).';

-- The blocks handed out with tickets in (p_after_ticket, p_upto_ticket], newest first, at most
-- p_limit: what the leader's sampling job measures the age at hand-out from (the claim
-- position of its previous run to the current one; the unique ticket index). Voided blocks
-- (claimed_by 'allocator:...') are not hand-outs and are left out; a claim not yet committed
-- is not seen. Read-only; node role.
CREATE FUNCTION allocator.claimed_block_ages(p_after_ticket bigint, p_upto_ticket bigint,
                                             p_limit integer)
RETURNS TABLE (ticket bigint, first_id bigint, claimed_at_ms bigint)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $fn$
    SELECT b.ticket, b.first_id, floor(extract(epoch FROM b.claimed_at) * 1000)::bigint
      FROM allocator.blocks b
     WHERE b.ticket > p_after_ticket AND b.ticket <= p_upto_ticket
       AND b.claimed_at IS NOT NULL
       AND b.claimed_by NOT LIKE 'allocator:%'
     ORDER BY b.ticket DESC
     LIMIT greatest(p_limit, 0);
$fn$;

COMMENT ON FUNCTION allocator.claimed_block_ages(bigint, bigint, integer) IS
    'Blocks handed out with tickets in (p_after_ticket, p_upto_ticket], newest first, at most '
    'p_limit, voided ones left out: ticket, first_id, claimed_at in Unix ms. Node role.';

CREATE VIEW allocator.block_age_status AS
SELECT s.max_block_age_ms, s.serve_aged_without_leader, s.heartbeat_at, s.leader_serves,
       s.oldest_unclaimed_age_ms
  FROM allocator.block_age_status_row() s;

-- -- owner and grants (docs/sql.md, "Roles and privileges") --------------------------------------
ALTER TABLE allocator.block_age OWNER TO allocator_owner;
ALTER TABLE allocator.serving_stretches OWNER TO allocator_owner;
ALTER VIEW allocator.serving_history OWNER TO allocator_owner;
ALTER VIEW allocator.block_age_status OWNER TO allocator_owner;
ALTER FUNCTION allocator.age_bound_id(bigint, boolean) OWNER TO allocator_owner;
ALTER SEQUENCE allocator.voided_tickets OWNER TO allocator_owner;
ALTER FUNCTION allocator.voided_position() OWNER TO allocator_owner;
ALTER FUNCTION allocator.claim_blocks_expiring(text, integer) OWNER TO allocator_owner;
ALTER FUNCTION allocator.leader_heartbeat(bigint, bigint, bigint, boolean, bigint)
    OWNER TO allocator_owner;
ALTER FUNCTION allocator.void_aged_blocks(bigint, bigint, bigint, integer) OWNER TO allocator_owner;
ALTER FUNCTION allocator.block_age_status_row() OWNER TO allocator_owner;
ALTER FUNCTION allocator.claimed_block_ages(bigint, bigint, integer) OWNER TO allocator_owner;

REVOKE ALL ON allocator.block_age, allocator.serving_stretches, allocator.serving_history,
    allocator.block_age_status
    FROM PUBLIC;
REVOKE ALL ON allocator.voided_tickets FROM PUBLIC;
REVOKE ALL ON FUNCTION allocator.age_bound_id(bigint, boolean),
    allocator.voided_position(),
    allocator.claim_blocks_expiring(text, integer),
    allocator.leader_heartbeat(bigint, bigint, bigint, boolean, bigint),
    allocator.void_aged_blocks(bigint, bigint, bigint, integer),
    allocator.block_age_status_row(),
    allocator.claimed_block_ages(bigint, bigint, integer)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION allocator.claim_blocks_expiring(text, integer) TO allocator_consumer;
GRANT EXECUTE ON FUNCTION allocator.leader_heartbeat(bigint, bigint, bigint, boolean, bigint),
    allocator.void_aged_blocks(bigint, bigint, bigint, integer),
    allocator.claimed_block_ages(bigint, bigint, integer)
    TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.block_age_status_row()
    TO allocator_consumer, allocator_node, allocator_operator;
GRANT SELECT ON allocator.block_age_status TO allocator_consumer, allocator_node, allocator_operator;
GRANT SELECT ON allocator.serving_history TO allocator_node, allocator_operator;

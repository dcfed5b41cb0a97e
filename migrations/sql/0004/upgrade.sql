-- allocator schema 0004: one slow consumer cannot degrade the pool. Executed by
-- migrations/versions/0004_held_tickets.py; its docstring argues the design.
--
-- * held_tickets: blocks requeue_stranded found locked by a claim still in flight. The floor
--   (high_water.requeued_upto) no longer stops below them: requeue_stranded advances it to
--   requeue_mark on every run and re-checks only these rows.
-- * claim_blocks bounds how long its transaction may sit idle (60 s), transaction-local.
-- Signatures, grants and error codes are unchanged.

-- Blocks whose ticket lies at or below the floor but whose claim had not committed when
-- requeue_stranded last looked (their row was locked). One row per such block; rows leave
-- when the claim committed (or the block is gone), or when the claim rolled back and the
-- block was requeued. Written only by requeue_stranded (the fenced leader).
CREATE TABLE allocator.held_tickets (
    block_id    bigint PRIMARY KEY,
    ticket      bigint NOT NULL,
    held_since  timestamptz NOT NULL DEFAULT clock_timestamp()
);
COMMENT ON TABLE allocator.held_tickets IS
    'Blocks below the requeue floor whose claim was still open at the last requeue_stranded run.';


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
    IF consumer IS NULL OR length(btrim(consumer)) = 0 THEN
        RAISE EXCEPTION 'consumer must be a non-empty name'
            USING ERRCODE = 'AL001', HINT = 'pass the application''s name, e.g. ''orders-api''';
    END IF;
    IF length(consumer) > 128 THEN
        RAISE EXCEPTION 'consumer name is % characters long; the maximum is 128', length(consumer)
            USING ERRCODE = 'AL001';
    END IF;
    IF consumer ~ '[[:cntrl:]]' THEN
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


-- Puts blocks stranded below the ticket position (their claim rolled back, or they were cut
-- while a claim drew their ticket) back at the end of the queue with fresh tickets. Leader
-- only, fenced on the token; logged in fenced_writes when it moved blocks. Considers the
-- window (requeued_upto, requeue_mark] (tickets drawn before the previous run, so a claim
-- still in flight normally finds its block; if not, its slow path takes another) plus the
-- held tickets of earlier runs. A block it cannot lock (a claim in flight holds it) is
-- recorded in held_tickets instead of stopping the floor: the floor always advances to
-- requeue_mark, so no scan here, in available_blocks or in the claim slow path grows with
-- how long one claim stays open. Held blocks are re-checked on every run: claimed (or gone)
-- -> forgotten; unclaimed and unlocked (the claim rolled back) -> requeued and forgotten;
-- still locked -> kept.
CREATE OR REPLACE FUNCTION allocator.requeue_stranded(p_generation bigint, p_epoch bigint)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off  -- the ticket window is narrow; never scan claimed history
SET jit = off             -- (the disabled seqscan's cost would trigger JIT compilation)
AS $fn$
DECLARE
    mark        allocator.high_water%ROWTYPE;
    mark_tid    tid;
    position    bigint;
    first_tk    bigint;
    held_before bigint[];
    candidates  bigint[];
    movable     bigint[];
    moved       integer;
BEGIN
    PERFORM allocator.lock_fence(p_generation, p_epoch);
    -- The row's ctid, to update it below without looking for it again: while a
    -- transaction stays open, every search walks all the row's dead versions.
    SELECT h.ctid INTO mark_tid FROM allocator.high_water h FOR UPDATE;
    SELECT * INTO mark FROM allocator.high_water h WHERE h.ctid = mark_tid;
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END INTO position
      FROM allocator.claim_ticket s;

    -- Unclaimed blocks of the window (one range scan of the ticket index), and every held
    -- block (a few primary-key rows; below the floor, so never in the window). Then lock
    -- those still unclaimed, skipping rows a claim in flight holds; the lock rechecks
    -- claimed_at on the newest version.
    held_before := ARRAY(SELECT t.block_id FROM allocator.held_tickets t);
    candidates := held_before || ARRAY(
        SELECT b.block_id
          FROM allocator.blocks b
         WHERE b.ticket > mark.requeued_upto AND b.ticket <= mark.requeue_mark
           AND b.claimed_at IS NULL);
    movable := ARRAY(
        SELECT b.block_id
          FROM allocator.blocks b
         WHERE b.block_id = ANY (candidates)
           AND b.claimed_at IS NULL
         ORDER BY b.ticket
           FOR UPDATE SKIP LOCKED);

    first_tk := greatest(mark.last_ticket, position) + 1;
    UPDATE allocator.blocks b
       SET ticket = first_tk + c.k - 1
      FROM unnest(movable) WITH ORDINALITY AS c(block_id, k)
     WHERE b.block_id = c.block_id;
    GET DIAGNOSTICS moved = ROW_COUNT;

    -- Candidates this run could not lock and that are still unclaimed: held from now on
    -- (a row already held keeps its held_since). Then forget every held block that was
    -- requeued above, or is claimed (its claim committed) or gone (pruned) by now.
    -- (Both skipped when there is nothing to hold or forget: the usual run.)
    IF cardinality(candidates) > cardinality(movable) THEN
        INSERT INTO allocator.held_tickets (block_id, ticket)
        SELECT b.block_id, b.ticket
          FROM allocator.blocks b
         WHERE b.block_id = ANY (candidates)
           AND b.block_id <> ALL (movable)
           AND b.claimed_at IS NULL
        ON CONFLICT (block_id) DO NOTHING;
    END IF;
    IF cardinality(candidates) > cardinality(movable) OR cardinality(held_before) > 0 THEN
        DELETE FROM allocator.held_tickets t
         WHERE t.block_id = ANY (movable)
            OR NOT EXISTS (SELECT 1 FROM allocator.blocks b
                            WHERE b.block_id = t.block_id AND b.claimed_at IS NULL);
    END IF;

    -- Written only when something changed (an idle pool leaves the row alone: each write
    -- is a row version every reader walks while some transaction stays open).
    IF moved > 0 OR mark.requeued_upto <> mark.requeue_mark OR mark.requeue_mark <> position THEN
        UPDATE allocator.high_water h
           SET last_ticket = CASE WHEN moved > 0 THEN first_tk + moved - 1 ELSE h.last_ticket END,
               requeued_upto = mark.requeue_mark,
               requeue_mark = position,
               updated_at = statement_timestamp()
         WHERE h.ctid = mark_tid;
        IF NOT FOUND THEN  -- cannot happen under the row lock; never skip the write silently
            RAISE EXCEPTION 'high_water row not found at %', mark_tid;
        END IF;
    END IF;
    IF moved > 0 THEN
        INSERT INTO allocator.fenced_writes (kind, generation, epoch, blocks)
        VALUES ('requeue', p_generation, p_epoch, moved);
    END IF;
    RETURN moved;
END
$fn$;


-- Unclaimed blocks and IDs: those with a ticket above the floor (requeued_upto), through
-- the ticket index, plus the unclaimed held blocks (below the floor, by primary key). Every
-- other block at or below the floor is claimed. A held block whose claim is still open
-- reads as unclaimed here, as every block of a claim in flight does.
-- enable_seqscan is off inside: the planner cannot see how narrow the range is (the floor
-- is read at run time) and would scan the whole table, which grows with claimed history.
-- PL/pgSQL rather than SQL: its plan is cached for the session, where a SQL function's
-- body is planned again on every call (for this two-part query, as long as running it).
CREATE OR REPLACE FUNCTION allocator.available_blocks(OUT blocks bigint, OUT ids bigint)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off  -- disabling seqscan inflates costs past jit_above_cost; JIT costs ~35 ms
AS $fn$
DECLARE
    floor_tk bigint;
BEGIN
    -- The floor is read once: while some transaction stays open, the high_water row keeps
    -- a dead version per leader write, and every read walks them.
    SELECT w.requeued_upto INTO floor_tk FROM allocator.high_water w;
    SELECT a.blocks + h.blocks, (a.ids + h.ids)::bigint INTO blocks, ids
      FROM (SELECT count(*) AS blocks, coalesce(sum(b.last_id - b.first_id + 1), 0) AS ids
              FROM allocator.blocks b
             WHERE b.ticket > floor_tk
               AND b.claimed_at IS NULL) a,
           (SELECT count(*) AS blocks, coalesce(sum(b.last_id - b.first_id + 1), 0) AS ids
              FROM allocator.blocks b
             WHERE b.block_id = ANY (ARRAY(SELECT t.block_id FROM allocator.held_tickets t))
               AND b.ticket <= floor_tk
               AND b.claimed_at IS NULL) h;
END
$fn$;


-- -- grants -----------------------------------------------------------------------------
-- The functions above keep their grants (CREATE OR REPLACE). held_tickets is written only
-- through requeue_stranded (SECURITY DEFINER); nobody gets DML on it; operators may read it.
REVOKE ALL ON allocator.held_tickets FROM PUBLIC;
GRANT SELECT ON allocator.held_tickets TO allocator_operator;

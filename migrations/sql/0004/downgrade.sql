-- allocator schema 0004, downgrade: back to the 0003 definitions of claim_blocks (as
-- written in 0001/functions.sql, with its comment), requeue_stranded (0003/upgrade.sql) and
-- available_blocks (0001/functions.sql), copied verbatim below; held_tickets is dropped.
-- CREATE OR REPLACE keeps the functions' grants and the views that use them.
--
-- Under the 0003 rules every unclaimed block at or below requeued_upto is one a claim in
-- flight holds, and requeue_stranded finds it again only above the floor. So before the
-- held tickets are forgotten, the floor moves back below the lowest of them that is still
-- unclaimed: the 0003 requeue then sees them in its window and requeues those whose claim
-- rolled back (it stops its floor at those still held, as 0003 does).
UPDATE allocator.high_water h
   SET requeued_upto = least(h.requeued_upto, s.lowest - 1)
  FROM (SELECT min(b.ticket) AS lowest
          FROM allocator.held_tickets t
          JOIN allocator.blocks b ON b.block_id = t.block_id
         WHERE b.claimed_at IS NULL) s
 WHERE s.lowest IS NOT NULL;

DROP TABLE allocator.held_tickets;

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
        -- position: those whose claims rolled back. Only tickets requeue_stranded already
        -- considers (requeued_upto, requeue_mark]: tickets drawn before its previous run, so
        -- never one a claim in flight is about to take; SKIP LOCKED, so it never waits.
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
    'only when the pool runs short); raises AL003 when none is available. Durable on return.';


-- Requeue (unchanged rules, see 0001), fenced on the token; logged when it moved blocks.
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
    position    bigint;
    first_tk    bigint;
    movable     bigint[];
    busy_tk     bigint;
    moved       integer;
BEGIN
    PERFORM allocator.lock_fence(p_generation, p_epoch);
    SELECT * INTO mark FROM allocator.high_water FOR UPDATE;
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END INTO position
      FROM allocator.claim_ticket s;

    movable := ARRAY(
        SELECT b.block_id
          FROM allocator.blocks b
         WHERE b.ticket > mark.requeued_upto AND b.ticket <= mark.requeue_mark
           AND b.claimed_at IS NULL
         ORDER BY b.ticket
           FOR UPDATE SKIP LOCKED);
    SELECT min(b.ticket) INTO busy_tk
      FROM allocator.blocks b
     WHERE b.ticket > mark.requeued_upto AND b.ticket <= mark.requeue_mark
       AND b.claimed_at IS NULL
       AND b.block_id <> ALL (movable);

    first_tk := greatest(mark.last_ticket, position) + 1;
    UPDATE allocator.blocks b
       SET ticket = first_tk + c.k - 1
      FROM unnest(movable) WITH ORDINALITY AS c(block_id, k)
     WHERE b.block_id = c.block_id;
    GET DIAGNOSTICS moved = ROW_COUNT;

    UPDATE allocator.high_water h
       SET last_ticket = CASE WHEN moved > 0 THEN first_tk + moved - 1 ELSE h.last_ticket END,
           requeued_upto = coalesce(busy_tk - 1, mark.requeue_mark),
           requeue_mark = position,
           updated_at = statement_timestamp();
    IF moved > 0 THEN
        INSERT INTO allocator.fenced_writes (kind, generation, epoch, blocks)
        VALUES ('requeue', p_generation, p_epoch, moved);
    END IF;
    RETURN moved;
END
$fn$;


CREATE OR REPLACE FUNCTION allocator.available_blocks(OUT blocks bigint, OUT ids bigint)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off  -- disabling seqscan inflates costs past jit_above_cost; JIT costs ~35 ms
AS $fn$
    SELECT count(*), coalesce(sum(b.last_id - b.first_id + 1), 0)::bigint
      FROM allocator.blocks b
     WHERE b.ticket > (SELECT h.requeued_upto FROM allocator.high_water h)
       AND b.claimed_at IS NULL;
$fn$;

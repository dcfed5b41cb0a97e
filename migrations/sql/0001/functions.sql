-- allocator schema 0001: functions. Every callable function is SECURITY DEFINER with a
-- pinned search_path; EXECUTE is revoked from PUBLIC in roles.sql and granted per role.
--
-- Own SQLSTATEs (class AL; stable, documented in docs/sql.md):
--   AL001 invalid consumer (NULL, empty, longer than 128 characters, control characters)
--   AL002 invalid block count (NULL, < 1, > 1000)
--   AL003 pool empty: no block available right now (retry after the leader refills)
--   AL100 fenced: the write's epoch is not the current fence epoch (stale leader)
--   AL101 stale takeover: the fence already holds an epoch >= the one offered
--   AL102 not after the high-water mark (I2: blocks must follow every block ever cut)
--   AL103 invalid block batch (shape: empty, arrays of different length, last < first,
--         out of order or overlapping within the batch)

-- I1 in the database, whoever inserts: after every INSERT statement, each new block must end
-- before the next block by first_id and start after the previous one (two index probes per
-- new row on blocks_first_id_unique). Inserts are serialised by cut_blocks' lock on the
-- high_water row, so concurrent inserts cannot slip past each other; a session that writes
-- around cut_blocks (a superuser) must not insert concurrently. Ranges never move: an
-- UPDATE of first_id/last_id is refused. Raises exclusion_violation (23P01), like the
-- exclusion constraint it replaces. (Blocks already pruned by retention are covered by
-- cut_blocks' high-water check.)
CREATE FUNCTION allocator.blocks_disjoint()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'block ranges never change (block %)', OLD.block_id
            USING ERRCODE = 'AL103';
    END IF;
    IF EXISTS (
        SELECT 1
          FROM inserted n
          JOIN LATERAL (SELECT b.last_id FROM allocator.blocks b
                         WHERE b.first_id < n.first_id
                         ORDER BY b.first_id DESC LIMIT 1) prev ON true
         WHERE prev.last_id >= n.first_id
    ) OR EXISTS (
        SELECT 1
          FROM inserted n
          JOIN LATERAL (SELECT b.first_id FROM allocator.blocks b
                         WHERE b.first_id > n.first_id
                         ORDER BY b.first_id LIMIT 1) next ON true
         WHERE next.first_id <= n.last_id
    ) THEN
        RAISE EXCEPTION 'blocks overlap: a new block shares IDs with another block'
            USING ERRCODE = 'exclusion_violation';
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER blocks_disjoint_insert
    AFTER INSERT ON allocator.blocks
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION allocator.blocks_disjoint();

CREATE TRIGGER blocks_ranges_fixed
    BEFORE UPDATE OF first_id, last_id ON allocator.blocks
    FOR EACH ROW EXECUTE FUNCTION allocator.blocks_disjoint();


CREATE FUNCTION allocator.claim_blocks(consumer text, n integer DEFAULT 1)
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


-- Takeover by a newly elected leader. Moves the fence forward only; records the term.
CREATE FUNCTION allocator.take_fence(p_epoch bigint, p_holder text, p_host text, p_pid integer)
RETURNS TABLE (high_water_id bigint, previous_epoch bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    prev bigint;
BEGIN
    IF p_epoch IS NULL OR p_epoch <= 0 OR p_holder IS NULL OR length(p_holder) = 0 THEN
        RAISE EXCEPTION 'take_fence needs a positive epoch and a holder name' USING ERRCODE = 'AL103';
    END IF;
    SELECT f.epoch INTO prev FROM allocator.fence f FOR UPDATE;
    UPDATE allocator.fence f
       SET epoch = p_epoch, holder = p_holder, host = p_host, pid = p_pid,
           taken_at = statement_timestamp()
     WHERE f.epoch < p_epoch;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'stale takeover: epoch % is not newer than the fence', p_epoch
            USING ERRCODE = 'AL101';
    END IF;
    UPDATE allocator.leader_terms t
       SET ended_at = statement_timestamp(), end_reason = 'superseded'
     WHERE t.ended_at IS NULL;
    INSERT INTO allocator.leader_terms (epoch, holder, host, pid)
    VALUES (p_epoch, p_holder, p_host, p_pid);
    RETURN QUERY SELECT h.last_id, prev FROM allocator.high_water h;
END
$fn$;


-- Ends the caller's own term (graceful step-down, shutdown). A no-op for a stale epoch.
CREATE FUNCTION allocator.end_term(p_epoch bigint, p_reason text)
RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    UPDATE allocator.leader_terms t
       SET ended_at = statement_timestamp(), end_reason = coalesce(nullif(p_reason, ''), 'ended')
     WHERE t.epoch = p_epoch AND t.ended_at IS NULL
    RETURNING true;
$fn$;


-- The fence check of every block write: lock the fence row FOR SHARE on the caller's exact
-- epoch, or raise AL100. The row lock lasts until the caller's transaction ends, and it
-- conflicts with take_fence's UPDATE: a takeover waits for a write in flight, and no write
-- can start once a newer epoch is committed. Equality, not ordering (DESIGN section 3).
CREATE FUNCTION allocator.lock_fence(p_epoch bigint)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM 1 FROM allocator.fence f WHERE f.epoch = p_epoch FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fenced: epoch % does not hold the fence', p_epoch
            USING ERRCODE = 'AL100', HINT = 'this node is no longer leader; it must stop writing';
    END IF;
END
$fn$;


-- Every block write: fenced on the exact epoch, monotonic against the high-water mark,
-- one INSERT for the whole batch, mark advanced in the same transaction.
CREATE FUNCTION allocator.cut_blocks(p_epoch bigint, p_first_ids bigint[], p_last_ids bigint[])
RETURNS TABLE (high_water_id bigint, last_ticket bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    n           integer := coalesce(cardinality(p_first_ids), 0);
    mark        allocator.high_water%ROWTYPE;
    position    bigint;
    first_tk    bigint;
BEGIN
    PERFORM allocator.lock_fence(p_epoch);
    IF n = 0 OR n <> coalesce(cardinality(p_last_ids), 0)
       OR array_ndims(p_first_ids) <> 1 OR array_ndims(p_last_ids) <> 1
       OR array_lower(p_first_ids, 1) <> 1 OR array_lower(p_last_ids, 1) <> 1 THEN
        RAISE EXCEPTION 'block batch must be two non-empty one-dimensional arrays of equal length, indexed from 1'
            USING ERRCODE = 'AL103';
    END IF;
    IF EXISTS (
        SELECT 1
          FROM (SELECT f, l, lag(l) OVER (ORDER BY o) AS prev_l
                  FROM unnest(p_first_ids, p_last_ids) WITH ORDINALITY AS u(f, l, o)) x
         WHERE x.f IS NULL OR x.l IS NULL OR x.l < x.f OR x.f <= x.prev_l
    ) THEN
        RAISE EXCEPTION 'block batch must be ascending, non-overlapping ranges with last >= first'
            USING ERRCODE = 'AL103';
    END IF;

    SELECT * INTO mark FROM allocator.high_water FOR UPDATE;
    IF p_first_ids[1] <= mark.last_id THEN
        RAISE EXCEPTION 'block % starts at or behind the high-water mark %', p_first_ids[1], mark.last_id
            USING ERRCODE = 'AL102';
    END IF;

    -- Tickets continue after every ticket already drawn, so a claim that drew a ticket too
    -- early (empty pool) never leaves a new block behind it.
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END INTO position
      FROM allocator.claim_ticket s;
    first_tk := greatest(mark.last_ticket, position) + 1;

    INSERT INTO allocator.blocks (ticket, first_id, last_id, epoch)
    SELECT first_tk + u.o - 1, u.f, u.l, p_epoch
      FROM unnest(p_first_ids, p_last_ids) WITH ORDINALITY AS u(f, l, o);

    UPDATE allocator.high_water h
       SET last_id = p_last_ids[n], last_ticket = first_tk + n - 1, updated_at = statement_timestamp();
    RETURN QUERY SELECT p_last_ids[n], first_tk + n - 1;
END
$fn$;


-- Puts blocks stranded below the ticket position (their claim rolled back, or they were cut
-- while a claim drew their ticket) back at the end of the queue with fresh tickets. Leader
-- only, fenced like cut_blocks. Only considers tickets drawn before the previous run, so a
-- claim still in flight normally finds its block; if not, its slow path takes another.
-- Rows locked by in-flight claims are left alone, and the floor (requeued_upto) stops below
-- the lowest of them, so a claim that rolls back later is found by a later run.
CREATE FUNCTION allocator.requeue_stranded(p_epoch bigint)
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
    PERFORM allocator.lock_fence(p_epoch);
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
    RETURN moved;
END
$fn$;


-- One sample of the ticket positions for the claim rate; keeps one hour of samples.
CREATE FUNCTION allocator.record_pool_sample()
RETURNS void
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    INSERT INTO allocator.pool_samples (claim_position, cut_position)
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END, h.last_ticket
      FROM allocator.claim_ticket s, allocator.high_water h
    ON CONFLICT (sampled_at) DO NOTHING;
    DELETE FROM allocator.pool_samples WHERE sampled_at < clock_timestamp() - interval '1 hour';
$fn$;


-- Unclaimed blocks and IDs. Every block with a ticket <= requeued_upto is claimed (or held
-- by a claim in flight), so only tickets above it are counted, through the ticket index.
-- enable_seqscan is off inside: the planner cannot see how narrow the range is (the floor
-- is read at run time) and would scan the whole table, which grows with claimed history.
CREATE FUNCTION allocator.available_blocks(OUT blocks bigint, OUT ids bigint)
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

-- pool_status reads the ticket sequence as a relation (checked against the view owner), so
-- consumers need no privilege on the sequence itself.
CREATE VIEW allocator.pool_status AS
WITH position AS (
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END AS claim_position
      FROM allocator.claim_ticket s
), rate AS (
    -- Tickets drawn per second since the oldest sample of the last minute (>= 1 s old).
    -- Tickets burned by misses (empty pool, rollbacks) count too: an upper bound.
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
SELECT a.blocks AS available_blocks,
       a.ids AS available_ids,
       r.blocks_per_s AS claim_rate_blocks_per_s,
       CASE WHEN r.blocks_per_s > 0 THEN a.blocks / r.blocks_per_s END AS runway_s,
       h.last_id AS high_water_id,
       h.last_ticket AS cut_position,
       p.claim_position,
       f.epoch,
       f.holder
  FROM allocator.available_blocks() a
 CROSS JOIN position p
 CROSS JOIN allocator.high_water h
 CROSS JOIN allocator.fence f
  LEFT JOIN rate r ON true;

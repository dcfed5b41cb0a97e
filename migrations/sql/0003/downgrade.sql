-- allocator schema 0003, downgrade: back to the 0002 schema (token = czxid alone, no
-- layout record, no clock bound). Refuses if two terms share an epoch across generations.
-- The old definitions below are copies of 0001/functions.sql and 0002/upgrade.sql.

DROP VIEW allocator.fence_history;
DROP VIEW allocator.layout;
DROP VIEW allocator.pool_status;
DROP VIEW allocator.block_ledger;
CREATE VIEW allocator.block_ledger AS
SELECT b.block_id, b.first_id, b.last_id, b.last_id - b.first_id + 1 AS size,
       b.epoch, b.cut_at, b.claimed_by, b.claimed_at
  FROM allocator.blocks b;
DROP VIEW allocator.leader_history;
CREATE VIEW allocator.leader_history AS
SELECT t.epoch, t.holder, t.host, t.pid, t.elected_at, t.ended_at, t.end_reason
  FROM allocator.leader_terms t;

DROP FUNCTION allocator.rebase_fence(text);
DROP FUNCTION allocator.prune_claimed(bigint, bigint, bigint, integer);
DROP FUNCTION allocator.requeue_stranded(bigint, bigint);
DROP FUNCTION allocator.cut_blocks(bigint, bigint, bigint[], bigint[], jsonb, bigint);
DROP FUNCTION allocator.end_term(bigint, bigint, text);
DROP FUNCTION allocator.take_fence(bigint, bigint, text, text, integer, jsonb);
DROP FUNCTION allocator.lock_fence(bigint, bigint);
DROP FUNCTION allocator.check_layout(jsonb, text);
DROP FUNCTION allocator.id_time_ms(bigint);
DROP FUNCTION allocator.db_now_ms();

DROP TABLE allocator.fenced_writes;
DROP TABLE allocator.fence_rebases;
DROP TABLE allocator.cluster_layout;
ALTER TABLE allocator.high_water DROP COLUMN marked_at;
ALTER TABLE allocator.leader_terms DROP CONSTRAINT leader_terms_pkey;
ALTER TABLE allocator.leader_terms ADD CONSTRAINT leader_terms_pkey PRIMARY KEY (epoch);
ALTER TABLE allocator.leader_terms DROP COLUMN generation;
ALTER TABLE allocator.blocks DROP COLUMN generation;
ALTER TABLE allocator.fence DROP COLUMN generation;

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

CREATE FUNCTION allocator.prune_claimed(p_epoch bigint, p_claimed_before timestamptz, p_limit integer)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    pruned integer;
BEGIN
    PERFORM allocator.lock_fence(p_epoch);
    IF p_claimed_before IS NULL OR p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'prune_claimed needs a cutoff time and a limit >= 1 (got %, %)',
            coalesce(p_claimed_before::text, 'NULL'), coalesce(p_limit::text, 'NULL')
            USING ERRCODE = 'AL103';
    END IF;

    -- Claimed rows are never updated again (claims only touch rows with claimed_at IS NULL,
    -- requeue_stranded likewise), so no lock is needed to pick them: a row this snapshot
    -- sees as claimed stays claimed.
    DELETE FROM allocator.blocks b
     WHERE b.block_id IN (
        SELECT o.block_id
          FROM allocator.blocks o
         WHERE o.claimed_at IS NOT NULL
           AND o.claimed_at < p_claimed_before
         ORDER BY o.ticket
         LIMIT p_limit);
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$fn$;

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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA allocator FROM PUBLIC;
GRANT SELECT ON allocator.pool_status TO allocator_consumer, allocator_node, allocator_operator;
GRANT SELECT ON allocator.block_ledger, allocator.leader_history
    TO allocator_node, allocator_operator;
GRANT EXECUTE ON FUNCTION allocator.take_fence(bigint, text, text, integer) TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.end_term(bigint, text) TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.cut_blocks(bigint, bigint[], bigint[]) TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.requeue_stranded(bigint) TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.prune_claimed(bigint, timestamptz, integer) TO allocator_node;

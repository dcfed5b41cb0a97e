-- allocator schema 0003: production faults. Executed by
-- migrations/versions/0003_production_faults.py; its docstring argues each rule.
--
-- New SQLSTATEs (docs/sql.md):
--   AL104 layout mismatch: the caller's layout or datacenter differs from the recorded one
--   AL105 clock ahead: a block's timestamp lies past db_now + the allowed lead
--   AL106 invalid operator request (e.g. an empty reason)

-- The fencing token becomes (generation, epoch): epoch stays the czxid of the leader's
-- election znode, in all 64 bits; generation is advanced only by rebase_fence.
ALTER TABLE allocator.fence
    ADD COLUMN generation bigint NOT NULL DEFAULT 0 CHECK (generation >= 0);
ALTER TABLE allocator.blocks ADD COLUMN generation bigint NOT NULL DEFAULT 0;
ALTER TABLE allocator.leader_terms ADD COLUMN generation bigint NOT NULL DEFAULT 0;
ALTER TABLE allocator.leader_terms DROP CONSTRAINT leader_terms_pkey;
ALTER TABLE allocator.leader_terms ADD CONSTRAINT leader_terms_pkey PRIMARY KEY (generation, epoch);

-- marked_at: the database clock at the cut that set the mark. The mark's lead over the
-- database clock at that cut (its ID time minus marked_at) bounds every later cut.
ALTER TABLE allocator.high_water ADD COLUMN marked_at timestamptz;
UPDATE allocator.high_water SET marked_at = coalesce(updated_at, clock_timestamp())
 WHERE last_id >= 0;

-- The layout every ID of this database was cut with: recorded by the first takeover or cut
-- after this migration, checked by every takeover and cut after that. One row.
CREATE TABLE allocator.cluster_layout (
    singleton        boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch_ms         bigint NOT NULL CHECK (epoch_ms >= 0),
    timestamp_bits   integer NOT NULL CHECK (timestamp_bits >= 1),
    datacenter_bits  integer NOT NULL CHECK (datacenter_bits >= 0),
    lane_bits        integer NOT NULL CHECK (lane_bits >= 0),
    sequence_bits    integer NOT NULL CHECK (sequence_bits >= 1),
    datacenter_id    integer NOT NULL CHECK (datacenter_id >= 0),
    recorded_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    recorded_by      text NOT NULL,
    CONSTRAINT cluster_layout_63_bits
        CHECK (timestamp_bits + datacenter_bits + lane_bits + sequence_bits = 63),
    CONSTRAINT cluster_layout_datacenter_fits CHECK (datacenter_id < (1::bigint << datacenter_bits))
);
COMMENT ON TABLE allocator.cluster_layout IS
    'The Snowflake layout and datacenter id of every ID cut here; changing it is not supported.';

-- Every re-base of the fence (after a ZooKeeper ensemble was wiped or restored).
CREATE TABLE allocator.fence_rebases (
    rebase_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rebased_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    rebased_by       text NOT NULL,
    old_generation   bigint NOT NULL,
    old_epoch        bigint NOT NULL,
    new_generation   bigint NOT NULL,
    reason           text NOT NULL
);

-- Fenced writes other than cuts (cuts are the blocks themselves): requeues and prunes
-- that changed something, with the token that made them, in commit-lock order.
CREATE TABLE allocator.fenced_writes (
    write_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    written_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind         text NOT NULL CHECK (kind IN ('requeue', 'prune')),
    generation   bigint NOT NULL,
    epoch        bigint NOT NULL,
    blocks       integer NOT NULL
);

-- -- helpers ----------------------------------------------------------------------------

-- The database clock in Unix milliseconds.
CREATE FUNCTION allocator.db_now_ms()
RETURNS bigint
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $fn$;

-- The Unix millisecond an ID carries, decoded with the recorded layout (NULL without one).
CREATE FUNCTION allocator.id_time_ms(p_id bigint)
RETURNS bigint
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT l.epoch_ms + (p_id >> (l.datacenter_bits + l.lane_bits + l.sequence_bits))
      FROM allocator.cluster_layout l
     WHERE p_id >= 0;
$fn$;

-- Checks the caller's layout (jsonb with epoch_ms, timestamp_bits, datacenter_bits,
-- lane_bits, sequence_bits, datacenter_id) against the recorded one, recording it first if
-- there is none. AL104 names both when they differ.
CREATE FUNCTION allocator.check_layout(p_layout jsonb, p_recorded_by text)
RETURNS allocator.cluster_layout
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    given     allocator.cluster_layout%ROWTYPE;
    recorded  allocator.cluster_layout%ROWTYPE;
BEGIN
    IF p_layout IS NULL OR jsonb_typeof(p_layout) <> 'object' THEN
        RAISE EXCEPTION 'a layout (jsonb object) is required' USING ERRCODE = 'AL104';
    END IF;
    BEGIN
        given.epoch_ms := (p_layout ->> 'epoch_ms')::bigint;
        given.timestamp_bits := (p_layout ->> 'timestamp_bits')::integer;
        given.datacenter_bits := (p_layout ->> 'datacenter_bits')::integer;
        given.lane_bits := (p_layout ->> 'lane_bits')::integer;
        given.sequence_bits := (p_layout ->> 'sequence_bits')::integer;
        given.datacenter_id := (p_layout ->> 'datacenter_id')::integer;
    EXCEPTION WHEN data_exception THEN
        RAISE EXCEPTION 'layout % has a value that is not an integer', p_layout
            USING ERRCODE = 'AL104';
    END;
    IF given.epoch_ms IS NULL OR given.timestamp_bits IS NULL OR given.datacenter_bits IS NULL
       OR given.lane_bits IS NULL OR given.sequence_bits IS NULL OR given.datacenter_id IS NULL THEN
        RAISE EXCEPTION 'layout % lacks a key (epoch_ms, timestamp_bits, datacenter_bits, lane_bits, sequence_bits, datacenter_id)', p_layout
            USING ERRCODE = 'AL104';
    END IF;
    SELECT * INTO recorded FROM allocator.cluster_layout;
    IF NOT FOUND THEN
        INSERT INTO allocator.cluster_layout (epoch_ms, timestamp_bits, datacenter_bits, lane_bits,
                                              sequence_bits, datacenter_id, recorded_by)
        VALUES (given.epoch_ms, given.timestamp_bits, given.datacenter_bits, given.lane_bits,
                given.sequence_bits, given.datacenter_id, coalesce(p_recorded_by, session_user))
        ON CONFLICT (singleton) DO NOTHING
        RETURNING * INTO recorded;
        IF recorded.singleton IS NULL THEN  -- another session recorded it first
            SELECT * INTO recorded FROM allocator.cluster_layout;
        END IF;
    END IF;
    IF (recorded.epoch_ms, recorded.timestamp_bits, recorded.datacenter_bits, recorded.lane_bits,
        recorded.sequence_bits, recorded.datacenter_id)
       IS DISTINCT FROM
       (given.epoch_ms, given.timestamp_bits, given.datacenter_bits, given.lane_bits,
        given.sequence_bits, given.datacenter_id) THEN
        RAISE EXCEPTION 'layout mismatch: this node has epoch_ms=% bits=%/%/%/% datacenter_id=%, the database recorded epoch_ms=% bits=%/%/%/% datacenter_id=% (timestamp/datacenter/lane/sequence)',
            given.epoch_ms, given.timestamp_bits, given.datacenter_bits, given.lane_bits,
            given.sequence_bits, given.datacenter_id,
            recorded.epoch_ms, recorded.timestamp_bits, recorded.datacenter_bits,
            recorded.lane_bits, recorded.sequence_bits, recorded.datacenter_id
            USING ERRCODE = 'AL104',
                  HINT = 'the layout of a cluster cannot change; fix the node''s [layout] and cluster.datacenter_id';
    END IF;
    RETURN recorded;
END
$fn$;

-- -- the fence --------------------------------------------------------------------------

DROP FUNCTION allocator.take_fence(bigint, text, text, integer);
DROP FUNCTION allocator.end_term(bigint, text);
DROP FUNCTION allocator.cut_blocks(bigint, bigint[], bigint[]);
DROP FUNCTION allocator.requeue_stranded(bigint);
DROP FUNCTION allocator.prune_claimed(bigint, timestamptz, integer);
DROP FUNCTION allocator.lock_fence(bigint);

-- The fence check of every fenced write: the exact token (generation, epoch), FOR SHARE
-- (conflicts with take_fence's and rebase_fence's UPDATE), or AL100. Equality, not order.
CREATE FUNCTION allocator.lock_fence(p_generation bigint, p_epoch bigint)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM 1 FROM allocator.fence f
     WHERE f.generation = p_generation AND f.epoch = p_epoch
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fenced: token (%, %) does not hold the fence', p_generation, p_epoch
            USING ERRCODE = 'AL100', HINT = 'this node is no longer leader; it must stop writing';
    END IF;
END
$fn$;

-- Takeover: checks the layout, moves the fence forward to (generation, epoch) only (AL101
-- otherwise, with the fence's token in the message), ends every open term, records the new
-- one. Returns the mark, the replaced token, and the mark's lead at its cut.
CREATE FUNCTION allocator.take_fence(p_generation bigint, p_epoch bigint, p_holder text,
                                     p_host text, p_pid integer, p_layout jsonb)
RETURNS TABLE (high_water_id bigint, previous_generation bigint, previous_epoch bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    prev       allocator.fence%ROWTYPE;
    locked_at  timestamptz;
BEGIN
    IF p_generation IS NULL OR p_generation < 0 OR p_epoch IS NULL OR p_epoch <= 0
       OR p_holder IS NULL OR length(p_holder) = 0 THEN
        RAISE EXCEPTION 'take_fence needs a generation >= 0, a positive epoch and a holder name'
            USING ERRCODE = 'AL103';
    END IF;
    PERFORM allocator.check_layout(p_layout, p_holder);
    SELECT * INTO prev FROM allocator.fence f FOR UPDATE;
    -- The term begins when the fence row is ours: every write of the previous token held it
    -- FOR SHARE and committed before this point, every later one fails lock_fence. So a
    -- block's cut_at (or a write's written_at) lies in exactly one term's
    -- [elected_at, ended_at): the checker can judge writes by these times.
    locked_at := clock_timestamp();
    IF (prev.generation, prev.epoch) >= (p_generation, p_epoch) THEN
        RAISE EXCEPTION 'stale takeover: token (%, %) is not newer than the fence (%, %)',
            p_generation, p_epoch, prev.generation, prev.epoch
            USING ERRCODE = 'AL101',
                  DETAIL = format('fence_generation=%s fence_epoch=%s', prev.generation, prev.epoch);
    END IF;
    UPDATE allocator.fence f
       SET generation = p_generation, epoch = p_epoch, holder = p_holder, host = p_host,
           pid = p_pid, taken_at = locked_at;
    UPDATE allocator.leader_terms t
       SET ended_at = locked_at, end_reason = 'superseded'
     WHERE t.ended_at IS NULL;
    INSERT INTO allocator.leader_terms (generation, epoch, holder, host, pid, elected_at)
    VALUES (p_generation, p_epoch, p_holder, p_host, p_pid, locked_at);
    RETURN QUERY SELECT h.last_id, prev.generation, prev.epoch FROM allocator.high_water h;
END
$fn$;

-- Ends the caller's own term (graceful step-down, shutdown). A no-op for another token.
CREATE FUNCTION allocator.end_term(p_generation bigint, p_epoch bigint, p_reason text)
RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    UPDATE allocator.leader_terms t
       SET ended_at = clock_timestamp(), end_reason = coalesce(nullif(p_reason, ''), 'ended')
     WHERE t.generation = p_generation AND t.epoch = p_epoch AND t.ended_at IS NULL
    RETURNING true;
$fn$;

-- Every block write: fenced on the exact token, layout checked, every block inside the
-- recorded datacenter, monotonic against the mark, no block past
-- db_now + greatest(p_max_ahead_ms, the mark's lead at the previous cut), one INSERT for
-- the batch, mark advanced in the same transaction.
CREATE FUNCTION allocator.cut_blocks(p_generation bigint, p_epoch bigint,
                                     p_first_ids bigint[], p_last_ids bigint[],
                                     p_layout jsonb, p_max_ahead_ms bigint)
RETURNS TABLE (high_water_id bigint, last_ticket bigint, lead_ms bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
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
$fn$;

-- Requeue (unchanged rules, see 0001), fenced on the token; logged when it moved blocks.
CREATE FUNCTION allocator.requeue_stranded(p_generation bigint, p_epoch bigint)
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

-- Retention (rules of 0002), fenced on the token; the cutoff comes from the database
-- clock (clock_timestamp() - p_retention_ms), never from the node's. Logged when it pruned.
CREATE FUNCTION allocator.prune_claimed(p_generation bigint, p_epoch bigint,
                                        p_retention_ms bigint, p_limit integer)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    pruned integer;
    cutoff timestamptz;
BEGIN
    PERFORM allocator.lock_fence(p_generation, p_epoch);
    IF p_retention_ms IS NULL OR p_retention_ms < 0 OR p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'prune_claimed needs a retention >= 0 ms and a limit >= 1 (got %, %)',
            coalesce(p_retention_ms::text, 'NULL'), coalesce(p_limit::text, 'NULL')
            USING ERRCODE = 'AL103';
    END IF;
    cutoff := clock_timestamp() - make_interval(secs => p_retention_ms / 1000.0);
    DELETE FROM allocator.blocks b
     WHERE b.block_id IN (
        SELECT o.block_id
          FROM allocator.blocks o
         WHERE o.claimed_at IS NOT NULL
           AND o.claimed_at < cutoff
         ORDER BY o.ticket
         LIMIT p_limit);
    GET DIAGNOSTICS pruned = ROW_COUNT;
    IF pruned > 0 THEN
        INSERT INTO allocator.fenced_writes (kind, generation, epoch, blocks)
        VALUES ('prune', p_generation, p_epoch, pruned);
    END IF;
    RETURN pruned;
END
$fn$;

-- Operator: re-base the fence after a ZooKeeper ensemble was wiped or restored. Advances
-- the generation, resets the epoch to 0 (any czxid of the new generation beats it), ends
-- the open term, and records who, when, why. The caller then writes the new generation
-- into ZooKeeper (allocator fence rebase does both, the database first).
CREATE FUNCTION allocator.rebase_fence(p_reason text)
RETURNS TABLE (old_generation bigint, old_epoch bigint, new_generation bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    prev allocator.fence%ROWTYPE;
BEGIN
    IF p_reason IS NULL OR length(btrim(p_reason)) = 0 OR length(p_reason) > 1000 THEN
        RAISE EXCEPTION 'a re-base needs a reason of 1..1000 characters' USING ERRCODE = 'AL106';
    END IF;
    SELECT * INTO prev FROM allocator.fence f FOR UPDATE;
    UPDATE allocator.fence f
       SET generation = prev.generation + 1, epoch = 0, holder = NULL, host = NULL, pid = NULL,
           taken_at = clock_timestamp();
    UPDATE allocator.leader_terms t
       SET ended_at = clock_timestamp(), end_reason = 'rebased'
     WHERE t.ended_at IS NULL;
    INSERT INTO allocator.fence_rebases (rebased_by, old_generation, old_epoch, new_generation, reason)
    VALUES (session_user, prev.generation, prev.epoch, prev.generation + 1, p_reason);
    RETURN QUERY SELECT prev.generation, prev.epoch, prev.generation + 1;
END
$fn$;

-- -- views ------------------------------------------------------------------------------

CREATE OR REPLACE VIEW allocator.block_ledger AS
SELECT b.block_id, b.first_id, b.last_id, b.last_id - b.first_id + 1 AS size,
       b.epoch, b.cut_at, b.claimed_by, b.claimed_at, b.generation
  FROM allocator.blocks b;

CREATE OR REPLACE VIEW allocator.leader_history AS
SELECT t.epoch, t.holder, t.host, t.pid, t.elected_at, t.ended_at, t.end_reason, t.generation
  FROM allocator.leader_terms t;

-- pool_status gains: the fence generation; the mark's ID time and its lead over the
-- database clock now (mark_ahead_ms, > 0 only when the mark is in the future) and at the
-- cut that set it (mark_lead_ms, the allowance of the next cut).
CREATE OR REPLACE VIEW allocator.pool_status AS
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
SELECT a.blocks AS available_blocks,
       a.ids AS available_ids,
       r.blocks_per_s AS claim_rate_blocks_per_s,
       CASE WHEN r.blocks_per_s > 0 THEN a.blocks / r.blocks_per_s END AS runway_s,
       h.last_id AS high_water_id,
       h.last_ticket AS cut_position,
       p.claim_position,
       f.epoch,
       f.holder,
       f.generation,
       allocator.id_time_ms(h.last_id) - allocator.db_now_ms() AS mark_ahead_ms,
       allocator.id_time_ms(h.last_id)
         - floor(extract(epoch FROM h.marked_at) * 1000)::bigint AS mark_lead_ms
  FROM allocator.available_blocks() a
 CROSS JOIN position p
 CROSS JOIN allocator.high_water h
 CROSS JOIN allocator.fence f
  LEFT JOIN rate r ON true;

CREATE VIEW allocator.fence_history AS
SELECT r.rebase_id, r.rebased_at, r.rebased_by, r.old_generation, r.old_epoch,
       r.new_generation, r.reason
  FROM allocator.fence_rebases r;

CREATE VIEW allocator.layout AS
SELECT l.epoch_ms, l.timestamp_bits, l.datacenter_bits, l.lane_bits, l.sequence_bits,
       l.datacenter_id, l.recorded_at, l.recorded_by
  FROM allocator.cluster_layout l;

-- -- grants -----------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA allocator FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA allocator FROM PUBLIC;

-- pool_status calls these two with the reader's privileges.
GRANT EXECUTE ON FUNCTION allocator.id_time_ms(bigint), allocator.db_now_ms()
    TO allocator_consumer, allocator_node, allocator_operator;
GRANT EXECUTE ON FUNCTION allocator.take_fence(bigint, bigint, text, text, integer, jsonb)
    TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.end_term(bigint, bigint, text) TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.cut_blocks(bigint, bigint, bigint[], bigint[], jsonb, bigint)
    TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.requeue_stranded(bigint, bigint) TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.prune_claimed(bigint, bigint, bigint, integer) TO allocator_node;
GRANT EXECUTE ON FUNCTION allocator.rebase_fence(text) TO allocator_operator;
GRANT SELECT ON allocator.fence_history, allocator.layout TO allocator_node, allocator_operator;
GRANT SELECT ON allocator.fenced_writes TO allocator_operator;

-- migrations/schema.sql: the schema `allocator migrate` makes, at revision 0013.
--
-- Generated: never edit it, and never apply it in place of the migrations (a database loaded
-- from it has no Alembic version; databases are made and changed by `allocator migrate`
-- alone, docs/sql.md). After adding a migration, regenerate it and commit both together:
--     make schema-snapshot        (python -m allocator.local.schema_snapshot)
-- That migrates an empty database of a throwaway PostgreSQL 15 server from base to head,
-- writes the roles the schema names (read from pg_roles), then
-- `pg_dump --exclude-schema=public --inserts --no-tablespaces --no-table-access-method`
-- without the dump's banner and session settings. tests/integration/test_schema_snapshot.py
-- loads this file into an empty database and proves both databases' dumps equal.
--
-- pg_dump's order: the schema, functions by name, tables, views and sequences, the rows the
-- migrations insert, constraints, indexes, triggers, then grants; each comment follows its
-- object.

SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SET check_function_bodies = false;
SET client_min_messages = warning;
SELECT pg_catalog.set_config('search_path', '', false);

-- Roles (cluster-wide; created when missing, as the migrations do)
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'allocator_consumer') THEN
        CREATE ROLE allocator_consumer NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB NOLOGIN NOREPLICATION NOBYPASSRLS CONNECTION LIMIT -1;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'allocator_node') THEN
        CREATE ROLE allocator_node NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB NOLOGIN NOREPLICATION NOBYPASSRLS CONNECTION LIMIT -1;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'allocator_operator') THEN
        CREATE ROLE allocator_operator NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB NOLOGIN NOREPLICATION NOBYPASSRLS CONNECTION LIMIT -1;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'allocator_owner') THEN
        CREATE ROLE allocator_owner NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB NOLOGIN NOREPLICATION NOBYPASSRLS CONNECTION LIMIT -1;
    END IF;
END
$roles$;

GRANT pg_read_all_stats TO allocator_owner;
-- End of roles


--
-- Name: allocator; Type: SCHEMA; Schema: -; Owner: allocator_owner
--

CREATE SCHEMA allocator;


ALTER SCHEMA allocator OWNER TO allocator_owner;

--
-- Name: SCHEMA allocator; Type: COMMENT; Schema: -; Owner: allocator_owner
--

COMMENT ON SCHEMA allocator IS 'Snowflake ID block allocator (see docs/design.md §6)';


--
-- Name: age_bound_id(bigint, boolean); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.age_bound_id(p_ahead_ms bigint DEFAULT 0, p_always boolean DEFAULT false) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
$$;


ALTER FUNCTION allocator.age_bound_id(p_ahead_ms bigint, p_always boolean) OWNER TO allocator_owner;

--
-- Name: available_blocks(); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.available_blocks(OUT blocks bigint, OUT ids bigint) RETURNS record
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
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
$$;


ALTER FUNCTION allocator.available_blocks(OUT blocks bigint, OUT ids bigint) OWNER TO allocator_owner;

--
-- Name: block_age_status_row(); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.block_age_status_row() RETURNS TABLE(max_block_age_ms bigint, serve_aged_without_leader boolean, heartbeat_at timestamp with time zone, leader_serves boolean, oldest_unclaimed_age_ms bigint)
    LANGUAGE plpgsql SECURITY DEFINER ROWS 1
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
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
$$;


ALTER FUNCTION allocator.block_age_status_row() OWNER TO allocator_owner;

--
-- Name: FUNCTION block_age_status_row(); Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON FUNCTION allocator.block_age_status_row() IS 'The one row of allocator.block_age_status (the view calls it; read the view).';


--
-- Name: blocks_disjoint(); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.blocks_disjoint() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
$$;


ALTER FUNCTION allocator.blocks_disjoint() OWNER TO allocator_owner;

--
-- Name: cluster_layout; Type: TABLE; Schema: allocator; Owner: allocator_owner
--

CREATE TABLE allocator.cluster_layout (
    singleton boolean DEFAULT true NOT NULL,
    epoch_ms bigint NOT NULL,
    timestamp_bits integer NOT NULL,
    datacenter_bits integer NOT NULL,
    lane_bits integer NOT NULL,
    sequence_bits integer NOT NULL,
    datacenter_id integer NOT NULL,
    recorded_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    recorded_by text NOT NULL,
    CONSTRAINT cluster_layout_63_bits CHECK (((((timestamp_bits + datacenter_bits) + lane_bits) + sequence_bits) = 63)),
    CONSTRAINT cluster_layout_datacenter_bits_check CHECK ((datacenter_bits >= 0)),
    CONSTRAINT cluster_layout_datacenter_fits CHECK ((datacenter_id < ((1)::bigint << datacenter_bits))),
    CONSTRAINT cluster_layout_datacenter_id_check CHECK ((datacenter_id >= 0)),
    CONSTRAINT cluster_layout_epoch_ms_check CHECK ((epoch_ms >= 0)),
    CONSTRAINT cluster_layout_lane_bits_check CHECK ((lane_bits >= 0)),
    CONSTRAINT cluster_layout_sequence_bits_check CHECK ((sequence_bits >= 1)),
    CONSTRAINT cluster_layout_singleton_check CHECK (singleton),
    CONSTRAINT cluster_layout_timestamp_bits_check CHECK ((timestamp_bits >= 1))
);


ALTER TABLE allocator.cluster_layout OWNER TO allocator_owner;

--
-- Name: TABLE cluster_layout; Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON TABLE allocator.cluster_layout IS 'The Snowflake layout and datacenter id of every ID cut here; changing it is not supported.';


--
-- Name: check_layout(jsonb, text); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.check_layout(p_layout jsonb, p_recorded_by text) RETURNS allocator.cluster_layout
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
$$;


ALTER FUNCTION allocator.check_layout(p_layout jsonb, p_recorded_by text) OWNER TO allocator_owner;

--
-- Name: claim_blocks(text, integer); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.claim_blocks(consumer text, n integer DEFAULT 1) RETURNS TABLE(block_id bigint, first_id bigint, last_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
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
$_$;


ALTER FUNCTION allocator.claim_blocks(consumer text, n integer) OWNER TO allocator_owner;

--
-- Name: FUNCTION claim_blocks(consumer text, n integer); Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON FUNCTION allocator.claim_blocks(consumer text, n integer) IS 'Claim up to n (1..1000) ID blocks for consumer. Returns the blocks claimed (fewer than n only when the pool runs short); raises AL003 when none is available, AL004 while an operator has paused claims. Durable on return. Bounds the calling transaction''s idle time to 60 s (idle_in_transaction_session_timeout, transaction-local; a shorter session value is kept). Holds the shared advisory lock (1095520067, 4) until its transaction ends. While a bound on an ID''s age is in force (allocator.block_age_status) it hands out no block whose first ID is older than max_block_age_ms.';


--
-- Name: claim_blocks_expiring(text, integer); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.claim_blocks_expiring(consumer text, n integer DEFAULT 1) RETURNS TABLE(block_id bigint, first_id bigint, last_id bigint, expires_in_ms bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
$$;


ALTER FUNCTION allocator.claim_blocks_expiring(consumer text, n integer) OWNER TO allocator_owner;

--
-- Name: FUNCTION claim_blocks_expiring(consumer text, n integer); Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON FUNCTION allocator.claim_blocks_expiring(consumer text, n integer) IS 'claim_blocks, plus expires_in_ms per block: milliseconds (database clock) until its first ID passes the bound on an ID''s age; NULL while no bound is in force.';


--
-- Name: claimed_block_ages(bigint, bigint, integer); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.claimed_block_ages(p_after_ticket bigint, p_upto_ticket bigint, p_limit integer) RETURNS TABLE(ticket bigint, first_id bigint, claimed_at_ms bigint)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET jit TO 'off'
    AS $$
    SELECT b.ticket, b.first_id, floor(extract(epoch FROM b.claimed_at) * 1000)::bigint
      FROM allocator.blocks b
     WHERE b.ticket > p_after_ticket AND b.ticket <= p_upto_ticket
       AND b.claimed_at IS NOT NULL
       AND b.claimed_by NOT LIKE 'allocator:%'
     ORDER BY b.ticket DESC
     LIMIT greatest(p_limit, 0);
$$;


ALTER FUNCTION allocator.claimed_block_ages(p_after_ticket bigint, p_upto_ticket bigint, p_limit integer) OWNER TO allocator_owner;

--
-- Name: FUNCTION claimed_block_ages(p_after_ticket bigint, p_upto_ticket bigint, p_limit integer); Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON FUNCTION allocator.claimed_block_ages(p_after_ticket bigint, p_upto_ticket bigint, p_limit integer) IS 'Blocks handed out with tickets in (p_after_ticket, p_upto_ticket], newest first, at most p_limit, voided ones left out: ticket, first_id, claimed_at in Unix ms. Node role.';


--
-- Name: claims_in_flight(); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.claims_in_flight() RETURNS TABLE(pid integer, virtualtransaction text, usename text, application_name text, client_addr inet, state text, xact_start timestamp with time zone, state_change timestamp with time zone)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
$$;


ALTER FUNCTION allocator.claims_in_flight() OWNER TO allocator_owner;

--
-- Name: FUNCTION claims_in_flight(); Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON FUNCTION allocator.claims_in_flight() IS 'Sessions holding claim_blocks'' shared advisory lock (1095520067, 4): a claim in their open transaction. allocator pool pause waits until those it saw after pausing are gone. Operator role.';


--
-- Name: cut_blocks(bigint, bigint, bigint[], bigint[], jsonb, bigint); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.cut_blocks(p_generation bigint, p_epoch bigint, p_first_ids bigint[], p_last_ids bigint[], p_layout jsonb, p_max_ahead_ms bigint) RETURNS TABLE(high_water_id bigint, last_ticket bigint, lead_ms bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

    -- The clock rule (docs/design.md §5): the database clock is the reference.
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
$$;


ALTER FUNCTION allocator.cut_blocks(p_generation bigint, p_epoch bigint, p_first_ids bigint[], p_last_ids bigint[], p_layout jsonb, p_max_ahead_ms bigint) OWNER TO allocator_owner;

--
-- Name: db_now_ms(); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.db_now_ms() RETURNS bigint
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;


ALTER FUNCTION allocator.db_now_ms() OWNER TO allocator_owner;

--
-- Name: end_term(bigint, bigint, text); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.end_term(p_generation bigint, p_epoch bigint, p_reason text) RETURNS boolean
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    UPDATE allocator.leader_terms t
       SET ended_at = clock_timestamp(), end_reason = coalesce(nullif(p_reason, ''), 'ended')
     WHERE t.generation = p_generation AND t.epoch = p_epoch AND t.ended_at IS NULL
    RETURNING true;
$$;


ALTER FUNCTION allocator.end_term(p_generation bigint, p_epoch bigint, p_reason text) OWNER TO allocator_owner;

--
-- Name: id_time_ms(bigint); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.id_time_ms(p_id bigint) RETURNS bigint
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT l.epoch_ms + (p_id >> (l.datacenter_bits + l.lane_bits + l.sequence_bits))
      FROM allocator.cluster_layout l
     WHERE p_id >= 0;
$$;


ALTER FUNCTION allocator.id_time_ms(p_id bigint) OWNER TO allocator_owner;

--
-- Name: leader_heartbeat(bigint, bigint, bigint, boolean, bigint); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.leader_heartbeat(p_generation bigint, p_epoch bigint, p_max_block_age_ms bigint, p_serve_aged_without_leader boolean, p_leader_stale_ms bigint) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
$$;


ALTER FUNCTION allocator.leader_heartbeat(p_generation bigint, p_epoch bigint, p_max_block_age_ms bigint, p_serve_aged_without_leader boolean, p_leader_stale_ms bigint) OWNER TO allocator_owner;

--
-- Name: FUNCTION leader_heartbeat(p_generation bigint, p_epoch bigint, p_max_block_age_ms bigint, p_serve_aged_without_leader boolean, p_leader_stale_ms bigint); Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON FUNCTION allocator.leader_heartbeat(p_generation bigint, p_epoch bigint, p_max_block_age_ms bigint, p_serve_aged_without_leader boolean, p_leader_stale_ms bigint) IS 'Fenced: the leader serves, with this bound on an ID''s age (allocator.block_age). Node role.';


--
-- Name: lock_fence(bigint, bigint); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.lock_fence(p_generation bigint, p_epoch bigint) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM 1 FROM allocator.fence f
     WHERE f.generation = p_generation AND f.epoch = p_epoch
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fenced: token (%, %) does not hold the fence', p_generation, p_epoch
            USING ERRCODE = 'AL100', HINT = 'this node is no longer leader; it must stop writing';
    END IF;
END
$$;


ALTER FUNCTION allocator.lock_fence(p_generation bigint, p_epoch bigint) OWNER TO allocator_owner;

--
-- Name: pause_claims(text); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.pause_claims(p_reason text) RETURNS TABLE(pause_id bigint, paused_at timestamp with time zone, paused_by text, reason text, already_paused boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
$$;


ALTER FUNCTION allocator.pause_claims(p_reason text) OWNER TO allocator_owner;

--
-- Name: FUNCTION pause_claims(p_reason text); Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON FUNCTION allocator.pause_claims(p_reason text) IS 'Pause claims (claim_blocks answers AL004), recorded in claim_pause_history; returns the open pause, already_paused when claims were paused before. Operator role.';


--
-- Name: pool_status_row(); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.pool_status_row() RETURNS TABLE(available_blocks bigint, available_ids bigint, claim_rate_blocks_per_s double precision, runway_s double precision, high_water_id bigint, cut_position bigint, claim_position bigint, epoch bigint, holder text, generation bigint, mark_ahead_ms bigint, mark_lead_ms bigint)
    LANGUAGE sql SECURITY DEFINER ROWS 1
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET jit TO 'off'
    AS $$
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
$$;


ALTER FUNCTION allocator.pool_status_row() OWNER TO allocator_owner;

--
-- Name: FUNCTION pool_status_row(); Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON FUNCTION allocator.pool_status_row() IS 'The one row of allocator.pool_status (the view calls it; read the view).';


--
-- Name: prune_claimed(bigint, bigint, bigint, integer); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.prune_claimed(p_generation bigint, p_epoch bigint, p_retention_ms bigint, p_limit integer) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
$$;


ALTER FUNCTION allocator.prune_claimed(p_generation bigint, p_epoch bigint, p_retention_ms bigint, p_limit integer) OWNER TO allocator_owner;

--
-- Name: rebase_fence(text); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.rebase_fence(p_reason text) RETURNS TABLE(old_generation bigint, old_epoch bigint, new_generation bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
$$;


ALTER FUNCTION allocator.rebase_fence(p_reason text) OWNER TO allocator_owner;

--
-- Name: record_pool_sample(); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.record_pool_sample() RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    INSERT INTO allocator.pool_samples (claim_position, cut_position)
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END, h.last_ticket
      FROM allocator.claim_ticket s, allocator.high_water h
    ON CONFLICT (sampled_at) DO NOTHING;
    DELETE FROM allocator.pool_samples WHERE sampled_at < clock_timestamp() - interval '1 hour';
$$;


ALTER FUNCTION allocator.record_pool_sample() OWNER TO allocator_owner;

--
-- Name: replication_status(); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.replication_status(OUT standbys integer, OUT synchronous_standbys integer, OUT synchronous_standby_names text, OUT synchronous_commit text, OUT in_recovery boolean) RETURNS record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT
        ((SELECT count(*) FROM pg_stat_replication)
         + (SELECT count(*) FROM pg_replication_slots
             WHERE slot_type = 'physical' AND NOT active))::integer,
        (SELECT count(*) FROM pg_stat_replication
          WHERE sync_state IN ('sync', 'quorum'))::integer,
        current_setting('synchronous_standby_names'),
        -- The caller's own setting: SECURITY DEFINER keeps the caller's settings unless the
        -- function sets them, and this one sets only search_path.
        current_setting('synchronous_commit'),
        pg_is_in_recovery()
$$;


ALTER FUNCTION allocator.replication_status(OUT standbys integer, OUT synchronous_standbys integer, OUT synchronous_standby_names text, OUT synchronous_commit text, OUT in_recovery boolean) OWNER TO allocator_owner;

--
-- Name: FUNCTION replication_status(OUT standbys integer, OUT synchronous_standbys integer, OUT synchronous_standby_names text, OUT synchronous_commit text, OUT in_recovery boolean); Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON FUNCTION allocator.replication_status(OUT standbys integer, OUT synchronous_standbys integer, OUT synchronous_standby_names text, OUT synchronous_commit text, OUT in_recovery boolean) IS 'How this server replicates: standbys (streaming now, or a physical slot waiting for one), how many of those a commit waits for, synchronous_standby_names, the caller''s synchronous_commit, and whether this server is itself a standby. Nodes refuse to cut when standbys > 0 and no commit waits for one (unless postgres.allow_async_replication).';


--
-- Name: requeue_stranded(bigint, bigint); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.requeue_stranded(p_generation bigint, p_epoch bigint) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
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
$$;


ALTER FUNCTION allocator.requeue_stranded(p_generation bigint, p_epoch bigint) OWNER TO allocator_owner;

--
-- Name: reset_after_restore(text, bigint, bigint); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.reset_after_restore(p_reason text, p_min_high_water_id bigint, p_max_ahead_ms bigint) RETURNS TABLE(voided_blocks bigint, old_high_water_id bigint, new_high_water_id bigint, old_generation bigint, old_epoch bigint, new_generation bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
$$;


ALTER FUNCTION allocator.reset_after_restore(p_reason text, p_min_high_water_id bigint, p_max_ahead_ms bigint) OWNER TO allocator_owner;

--
-- Name: FUNCTION reset_after_restore(p_reason text, p_min_high_water_id bigint, p_max_ahead_ms bigint); Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON FUNCTION allocator.reset_after_restore(p_reason text, p_min_high_water_id bigint, p_max_ahead_ms bigint) IS 'After a restore from a backup (or a failover that lost commits): void every unclaimed block, move the mark past db_now + p_max_ahead_ms and p_min_high_water_id (ZooKeeper''s watermark), advance the fence generation; recorded in pool_resets. Operator role.';


--
-- Name: resume_claims(text); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.resume_claims(p_reason text) RETURNS TABLE(pause_id bigint, paused_at timestamp with time zone, paused_by text, reason text, resumed_at timestamp with time zone, resumed_by text, resume_reason text, was_paused boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
$$;


ALTER FUNCTION allocator.resume_claims(p_reason text) OWNER TO allocator_owner;

--
-- Name: FUNCTION resume_claims(p_reason text); Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON FUNCTION allocator.resume_claims(p_reason text) IS 'Resume claims paused by pause_claims (or by reset_after_restore), recorded in claim_pause_history; was_paused = false when they were not paused. Operator role.';


--
-- Name: take_fence(bigint, bigint, text, text, integer, jsonb); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.take_fence(p_generation bigint, p_epoch bigint, p_holder text, p_host text, p_pid integer, p_layout jsonb) RETURNS TABLE(high_water_id bigint, previous_generation bigint, previous_epoch bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
$$;


ALTER FUNCTION allocator.take_fence(p_generation bigint, p_epoch bigint, p_holder text, p_host text, p_pid integer, p_layout jsonb) OWNER TO allocator_owner;

--
-- Name: void_aged_blocks(bigint, bigint, bigint, integer); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.void_aged_blocks(p_generation bigint, p_epoch bigint, p_ahead_ms bigint, p_limit integer) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
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
$$;


ALTER FUNCTION allocator.void_aged_blocks(p_generation bigint, p_epoch bigint, p_ahead_ms bigint, p_limit integer) OWNER TO allocator_owner;

--
-- Name: FUNCTION void_aged_blocks(p_generation bigint, p_epoch bigint, p_ahead_ms bigint, p_limit integer); Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON FUNCTION allocator.void_aged_blocks(p_generation bigint, p_epoch bigint, p_ahead_ms bigint, p_limit integer) IS 'Fenced: voids at most p_limit unclaimed blocks older than max_block_age_ms - p_ahead_ms, oldest first, and moves the claim tickets past them. Node role.';


--
-- Name: voided_position(); Type: FUNCTION; Schema: allocator; Owner: allocator_owner
--

CREATE FUNCTION allocator.voided_position() RETURNS bigint
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END FROM allocator.voided_tickets s;
$$;


ALTER FUNCTION allocator.voided_position() OWNER TO allocator_owner;

--
-- Name: block_age; Type: TABLE; Schema: allocator; Owner: allocator_owner
--

CREATE TABLE allocator.block_age (
    singleton boolean DEFAULT true NOT NULL,
    max_block_age_ms bigint NOT NULL,
    serve_aged_without_leader boolean NOT NULL,
    leader_stale_ms bigint NOT NULL,
    heartbeat_at timestamp with time zone NOT NULL,
    generation bigint NOT NULL,
    epoch bigint NOT NULL,
    CONSTRAINT block_age_leader_stale_ms_check CHECK ((leader_stale_ms >= 1)),
    CONSTRAINT block_age_max_block_age_ms_check CHECK ((max_block_age_ms >= 1)),
    CONSTRAINT block_age_singleton_check CHECK (singleton)
);


ALTER TABLE allocator.block_age OWNER TO allocator_owner;

--
-- Name: TABLE block_age; Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON TABLE allocator.block_age IS 'The bound on an ID''s age and the leader''s heartbeat (one row; leader_heartbeat writes it).';


--
-- Name: block_age_status; Type: VIEW; Schema: allocator; Owner: allocator_owner
--

CREATE VIEW allocator.block_age_status AS
 SELECT s.max_block_age_ms,
    s.serve_aged_without_leader,
    s.heartbeat_at,
    s.leader_serves,
    s.oldest_unclaimed_age_ms
   FROM allocator.block_age_status_row() s(max_block_age_ms, serve_aged_without_leader, heartbeat_at, leader_serves, oldest_unclaimed_age_ms);


ALTER TABLE allocator.block_age_status OWNER TO allocator_owner;

--
-- Name: blocks; Type: TABLE; Schema: allocator; Owner: allocator_owner
--

CREATE TABLE allocator.blocks (
    block_id bigint NOT NULL,
    ticket bigint NOT NULL,
    first_id bigint NOT NULL,
    last_id bigint NOT NULL,
    epoch bigint NOT NULL,
    cut_at timestamp with time zone DEFAULT statement_timestamp() NOT NULL,
    claimed_by text,
    claimed_at timestamp with time zone,
    generation bigint DEFAULT 0 NOT NULL,
    CONSTRAINT blocks_claim_complete CHECK (((claimed_by IS NULL) = (claimed_at IS NULL))),
    CONSTRAINT blocks_first_id_check CHECK ((first_id >= 0)),
    CONSTRAINT blocks_range_valid CHECK ((last_id >= first_id))
)
WITH (fillfactor='50');


ALTER TABLE allocator.blocks OWNER TO allocator_owner;

--
-- Name: TABLE blocks; Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON TABLE allocator.blocks IS 'Cut blocks of Snowflake IDs; claims update claimed_by/claimed_at in place (HOT).';


--
-- Name: block_ledger; Type: VIEW; Schema: allocator; Owner: allocator_owner
--

CREATE VIEW allocator.block_ledger AS
 SELECT b.block_id,
    b.first_id,
    b.last_id,
    ((b.last_id - b.first_id) + 1) AS size,
    b.epoch,
    b.cut_at,
    b.claimed_by,
    b.claimed_at,
    b.generation
   FROM allocator.blocks b;


ALTER TABLE allocator.block_ledger OWNER TO allocator_owner;

--
-- Name: blocks_block_id_seq; Type: SEQUENCE; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE allocator.blocks ALTER COLUMN block_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME allocator.blocks_block_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: claim_pause; Type: TABLE; Schema: allocator; Owner: allocator_owner
--

CREATE TABLE allocator.claim_pause (
    singleton boolean DEFAULT true NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    pause_id bigint,
    CONSTRAINT claim_pause_open CHECK ((paused = (pause_id IS NOT NULL))),
    CONSTRAINT claim_pause_singleton_check CHECK (singleton)
);


ALTER TABLE allocator.claim_pause OWNER TO allocator_owner;

--
-- Name: TABLE claim_pause; Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON TABLE allocator.claim_pause IS 'Whether claims are paused (one row); written only by pause_claims, resume_claims and reset_after_restore.';


--
-- Name: claim_pauses; Type: TABLE; Schema: allocator; Owner: allocator_owner
--

CREATE TABLE allocator.claim_pauses (
    pause_id bigint NOT NULL,
    paused_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    paused_by text NOT NULL,
    reason text NOT NULL,
    resumed_at timestamp with time zone,
    resumed_by text,
    resume_reason text,
    CONSTRAINT claim_pauses_resume_complete CHECK ((((resumed_at IS NULL) = (resumed_by IS NULL)) AND ((resumed_at IS NULL) = (resume_reason IS NULL))))
);


ALTER TABLE allocator.claim_pauses OWNER TO allocator_owner;

--
-- Name: TABLE claim_pauses; Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON TABLE allocator.claim_pauses IS 'Every allocator pool pause / resume (and pool reset --after-restore): who, when, why.';


--
-- Name: claim_pause_history; Type: VIEW; Schema: allocator; Owner: allocator_owner
--

CREATE VIEW allocator.claim_pause_history AS
 SELECT c.pause_id,
    c.paused_at,
    c.paused_by,
    c.reason,
    c.resumed_at,
    c.resumed_by,
    c.resume_reason
   FROM allocator.claim_pauses c;


ALTER TABLE allocator.claim_pause_history OWNER TO allocator_owner;

--
-- Name: claim_pauses_pause_id_seq; Type: SEQUENCE; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE allocator.claim_pauses ALTER COLUMN pause_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME allocator.claim_pauses_pause_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: claim_ticket; Type: SEQUENCE; Schema: allocator; Owner: allocator_owner
--

CREATE SEQUENCE allocator.claim_ticket
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


ALTER TABLE allocator.claim_ticket OWNER TO allocator_owner;

--
-- Name: fence; Type: TABLE; Schema: allocator; Owner: allocator_owner
--

CREATE TABLE allocator.fence (
    singleton boolean DEFAULT true NOT NULL,
    epoch bigint DEFAULT 0 NOT NULL,
    holder text,
    host text,
    pid integer,
    taken_at timestamp with time zone,
    generation bigint DEFAULT 0 NOT NULL,
    CONSTRAINT fence_epoch_check CHECK ((epoch >= 0)),
    CONSTRAINT fence_generation_check CHECK ((generation >= 0)),
    CONSTRAINT fence_singleton_check CHECK (singleton)
);


ALTER TABLE allocator.fence OWNER TO allocator_owner;

--
-- Name: fence_rebases; Type: TABLE; Schema: allocator; Owner: allocator_owner
--

CREATE TABLE allocator.fence_rebases (
    rebase_id bigint NOT NULL,
    rebased_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    rebased_by text NOT NULL,
    old_generation bigint NOT NULL,
    old_epoch bigint NOT NULL,
    new_generation bigint NOT NULL,
    reason text NOT NULL
);


ALTER TABLE allocator.fence_rebases OWNER TO allocator_owner;

--
-- Name: fence_history; Type: VIEW; Schema: allocator; Owner: allocator_owner
--

CREATE VIEW allocator.fence_history AS
 SELECT r.rebase_id,
    r.rebased_at,
    r.rebased_by,
    r.old_generation,
    r.old_epoch,
    r.new_generation,
    r.reason
   FROM allocator.fence_rebases r;


ALTER TABLE allocator.fence_history OWNER TO allocator_owner;

--
-- Name: fence_rebases_rebase_id_seq; Type: SEQUENCE; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE allocator.fence_rebases ALTER COLUMN rebase_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME allocator.fence_rebases_rebase_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: fenced_writes; Type: TABLE; Schema: allocator; Owner: allocator_owner
--

CREATE TABLE allocator.fenced_writes (
    write_id bigint NOT NULL,
    written_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    kind text NOT NULL,
    generation bigint NOT NULL,
    epoch bigint NOT NULL,
    blocks integer NOT NULL,
    CONSTRAINT fenced_writes_kind_check CHECK ((kind = ANY (ARRAY['requeue'::text, 'prune'::text])))
);


ALTER TABLE allocator.fenced_writes OWNER TO allocator_owner;

--
-- Name: fenced_writes_write_id_seq; Type: SEQUENCE; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE allocator.fenced_writes ALTER COLUMN write_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME allocator.fenced_writes_write_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: held_tickets; Type: TABLE; Schema: allocator; Owner: allocator_owner
--

CREATE TABLE allocator.held_tickets (
    block_id bigint NOT NULL,
    ticket bigint NOT NULL,
    held_since timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


ALTER TABLE allocator.held_tickets OWNER TO allocator_owner;

--
-- Name: TABLE held_tickets; Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON TABLE allocator.held_tickets IS 'Blocks below the requeue floor whose claim was still open at the last requeue_stranded run.';


--
-- Name: high_water; Type: TABLE; Schema: allocator; Owner: allocator_owner
--

CREATE TABLE allocator.high_water (
    singleton boolean DEFAULT true NOT NULL,
    last_id bigint DEFAULT '-1'::integer NOT NULL,
    last_ticket bigint DEFAULT 0 NOT NULL,
    requeued_upto bigint DEFAULT 0 NOT NULL,
    requeue_mark bigint DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone,
    marked_at timestamp with time zone,
    CONSTRAINT high_water_last_id_check CHECK ((last_id >= '-1'::integer)),
    CONSTRAINT high_water_last_ticket_check CHECK ((last_ticket >= 0)),
    CONSTRAINT high_water_requeue_mark_check CHECK ((requeue_mark >= 0)),
    CONSTRAINT high_water_requeued_upto_check CHECK ((requeued_upto >= 0)),
    CONSTRAINT high_water_singleton_check CHECK (singleton)
);


ALTER TABLE allocator.high_water OWNER TO allocator_owner;

--
-- Name: layout; Type: VIEW; Schema: allocator; Owner: allocator_owner
--

CREATE VIEW allocator.layout AS
 SELECT l.epoch_ms,
    l.timestamp_bits,
    l.datacenter_bits,
    l.lane_bits,
    l.sequence_bits,
    l.datacenter_id,
    l.recorded_at,
    l.recorded_by
   FROM allocator.cluster_layout l;


ALTER TABLE allocator.layout OWNER TO allocator_owner;

--
-- Name: leader_terms; Type: TABLE; Schema: allocator; Owner: allocator_owner
--

CREATE TABLE allocator.leader_terms (
    epoch bigint NOT NULL,
    holder text NOT NULL,
    host text,
    pid integer,
    elected_at timestamp with time zone DEFAULT statement_timestamp() NOT NULL,
    ended_at timestamp with time zone,
    end_reason text,
    generation bigint DEFAULT 0 NOT NULL,
    CONSTRAINT leader_terms_end_complete CHECK (((ended_at IS NULL) = (end_reason IS NULL)))
);


ALTER TABLE allocator.leader_terms OWNER TO allocator_owner;

--
-- Name: leader_history; Type: VIEW; Schema: allocator; Owner: allocator_owner
--

CREATE VIEW allocator.leader_history AS
 SELECT t.epoch,
    t.holder,
    t.host,
    t.pid,
    t.elected_at,
    t.ended_at,
    t.end_reason,
    t.generation
   FROM allocator.leader_terms t;


ALTER TABLE allocator.leader_history OWNER TO allocator_owner;

--
-- Name: pool_resets; Type: TABLE; Schema: allocator; Owner: allocator_owner
--

CREATE TABLE allocator.pool_resets (
    reset_id bigint NOT NULL,
    reset_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    reset_by text NOT NULL,
    reason text NOT NULL,
    voided_blocks bigint NOT NULL,
    old_high_water_id bigint NOT NULL,
    new_high_water_id bigint NOT NULL,
    old_generation bigint NOT NULL,
    old_epoch bigint NOT NULL,
    new_generation bigint NOT NULL
);


ALTER TABLE allocator.pool_resets OWNER TO allocator_owner;

--
-- Name: TABLE pool_resets; Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON TABLE allocator.pool_resets IS 'Every allocator pool reset --after-restore: who, when, why, what it voided and moved.';


--
-- Name: pool_resets_reset_id_seq; Type: SEQUENCE; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE allocator.pool_resets ALTER COLUMN reset_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME allocator.pool_resets_reset_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: pool_samples; Type: TABLE; Schema: allocator; Owner: allocator_owner
--

CREATE TABLE allocator.pool_samples (
    sampled_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    claim_position bigint NOT NULL,
    cut_position bigint NOT NULL,
    voided_position bigint DEFAULT allocator.voided_position() NOT NULL
);


ALTER TABLE allocator.pool_samples OWNER TO allocator_owner;

--
-- Name: pool_status; Type: VIEW; Schema: allocator; Owner: allocator_owner
--

CREATE VIEW allocator.pool_status AS
 SELECT s.available_blocks,
    s.available_ids,
    s.claim_rate_blocks_per_s,
    s.runway_s,
    s.high_water_id,
    s.cut_position,
    s.claim_position,
    s.epoch,
    s.holder,
    s.generation,
    s.mark_ahead_ms,
    s.mark_lead_ms,
    p.paused AS claims_paused
   FROM (allocator.pool_status_row() s(available_blocks, available_ids, claim_rate_blocks_per_s, runway_s, high_water_id, cut_position, claim_position, epoch, holder, generation, mark_ahead_ms, mark_lead_ms)
     CROSS JOIN allocator.claim_pause p);


ALTER TABLE allocator.pool_status OWNER TO allocator_owner;

--
-- Name: serving_stretches; Type: TABLE; Schema: allocator; Owner: allocator_owner
--

CREATE TABLE allocator.serving_stretches (
    stretch_id bigint NOT NULL,
    generation bigint NOT NULL,
    epoch bigint NOT NULL,
    max_block_age_ms bigint NOT NULL,
    serve_aged_without_leader boolean NOT NULL,
    leader_stale_ms bigint NOT NULL,
    first_at timestamp with time zone NOT NULL,
    last_at timestamp with time zone NOT NULL,
    heartbeats bigint DEFAULT 1 NOT NULL,
    CONSTRAINT serving_stretches_ordered CHECK ((last_at >= first_at))
);


ALTER TABLE allocator.serving_stretches OWNER TO allocator_owner;

--
-- Name: TABLE serving_stretches; Type: COMMENT; Schema: allocator; Owner: allocator_owner
--

COMMENT ON TABLE allocator.serving_stretches IS 'Stretches of leader heartbeats (leader_heartbeat): when a leader served, with its bound.';


--
-- Name: serving_history; Type: VIEW; Schema: allocator; Owner: allocator_owner
--

CREATE VIEW allocator.serving_history AS
 SELECT s.stretch_id,
    s.generation,
    s.epoch,
    s.max_block_age_ms,
    s.serve_aged_without_leader,
    s.leader_stale_ms,
    s.first_at,
    s.last_at,
    s.heartbeats
   FROM allocator.serving_stretches s;


ALTER TABLE allocator.serving_history OWNER TO allocator_owner;

--
-- Name: serving_stretches_stretch_id_seq; Type: SEQUENCE; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE allocator.serving_stretches ALTER COLUMN stretch_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME allocator.serving_stretches_stretch_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: voided_tickets; Type: SEQUENCE; Schema: allocator; Owner: allocator_owner
--

CREATE SEQUENCE allocator.voided_tickets
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


ALTER TABLE allocator.voided_tickets OWNER TO allocator_owner;

--
-- Data for Name: block_age; Type: TABLE DATA; Schema: allocator; Owner: allocator_owner
--


--
-- Data for Name: blocks; Type: TABLE DATA; Schema: allocator; Owner: allocator_owner
--


--
-- Data for Name: claim_pause; Type: TABLE DATA; Schema: allocator; Owner: allocator_owner
--

INSERT INTO allocator.claim_pause VALUES (true, false, NULL);


--
-- Data for Name: claim_pauses; Type: TABLE DATA; Schema: allocator; Owner: allocator_owner
--


--
-- Data for Name: cluster_layout; Type: TABLE DATA; Schema: allocator; Owner: allocator_owner
--


--
-- Data for Name: fence; Type: TABLE DATA; Schema: allocator; Owner: allocator_owner
--

INSERT INTO allocator.fence VALUES (true, 0, NULL, NULL, NULL, NULL, 0);


--
-- Data for Name: fence_rebases; Type: TABLE DATA; Schema: allocator; Owner: allocator_owner
--


--
-- Data for Name: fenced_writes; Type: TABLE DATA; Schema: allocator; Owner: allocator_owner
--


--
-- Data for Name: held_tickets; Type: TABLE DATA; Schema: allocator; Owner: allocator_owner
--


--
-- Data for Name: high_water; Type: TABLE DATA; Schema: allocator; Owner: allocator_owner
--

INSERT INTO allocator.high_water VALUES (true, -1, 0, 0, 0, NULL, NULL);


--
-- Data for Name: leader_terms; Type: TABLE DATA; Schema: allocator; Owner: allocator_owner
--


--
-- Data for Name: pool_resets; Type: TABLE DATA; Schema: allocator; Owner: allocator_owner
--


--
-- Data for Name: pool_samples; Type: TABLE DATA; Schema: allocator; Owner: allocator_owner
--


--
-- Data for Name: serving_stretches; Type: TABLE DATA; Schema: allocator; Owner: allocator_owner
--


--
-- Name: blocks_block_id_seq; Type: SEQUENCE SET; Schema: allocator; Owner: allocator_owner
--

SELECT pg_catalog.setval('allocator.blocks_block_id_seq', 1, false);


--
-- Name: claim_pauses_pause_id_seq; Type: SEQUENCE SET; Schema: allocator; Owner: allocator_owner
--

SELECT pg_catalog.setval('allocator.claim_pauses_pause_id_seq', 1, false);


--
-- Name: claim_ticket; Type: SEQUENCE SET; Schema: allocator; Owner: allocator_owner
--

SELECT pg_catalog.setval('allocator.claim_ticket', 1, false);


--
-- Name: fence_rebases_rebase_id_seq; Type: SEQUENCE SET; Schema: allocator; Owner: allocator_owner
--

SELECT pg_catalog.setval('allocator.fence_rebases_rebase_id_seq', 1, false);


--
-- Name: fenced_writes_write_id_seq; Type: SEQUENCE SET; Schema: allocator; Owner: allocator_owner
--

SELECT pg_catalog.setval('allocator.fenced_writes_write_id_seq', 1, false);


--
-- Name: pool_resets_reset_id_seq; Type: SEQUENCE SET; Schema: allocator; Owner: allocator_owner
--

SELECT pg_catalog.setval('allocator.pool_resets_reset_id_seq', 1, false);


--
-- Name: serving_stretches_stretch_id_seq; Type: SEQUENCE SET; Schema: allocator; Owner: allocator_owner
--

SELECT pg_catalog.setval('allocator.serving_stretches_stretch_id_seq', 1, false);


--
-- Name: voided_tickets; Type: SEQUENCE SET; Schema: allocator; Owner: allocator_owner
--

SELECT pg_catalog.setval('allocator.voided_tickets', 1, false);


--
-- Name: block_age block_age_pkey; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.block_age
    ADD CONSTRAINT block_age_pkey PRIMARY KEY (singleton);


--
-- Name: blocks blocks_first_id_unique; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.blocks
    ADD CONSTRAINT blocks_first_id_unique UNIQUE (first_id);


--
-- Name: blocks blocks_pkey; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.blocks
    ADD CONSTRAINT blocks_pkey PRIMARY KEY (block_id);


--
-- Name: blocks blocks_ticket_unique; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.blocks
    ADD CONSTRAINT blocks_ticket_unique UNIQUE (ticket);


--
-- Name: claim_pause claim_pause_pkey; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.claim_pause
    ADD CONSTRAINT claim_pause_pkey PRIMARY KEY (singleton);


--
-- Name: claim_pauses claim_pauses_pkey; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.claim_pauses
    ADD CONSTRAINT claim_pauses_pkey PRIMARY KEY (pause_id);


--
-- Name: cluster_layout cluster_layout_pkey; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.cluster_layout
    ADD CONSTRAINT cluster_layout_pkey PRIMARY KEY (singleton);


--
-- Name: fence fence_pkey; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.fence
    ADD CONSTRAINT fence_pkey PRIMARY KEY (singleton);


--
-- Name: fence_rebases fence_rebases_pkey; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.fence_rebases
    ADD CONSTRAINT fence_rebases_pkey PRIMARY KEY (rebase_id);


--
-- Name: fenced_writes fenced_writes_pkey; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.fenced_writes
    ADD CONSTRAINT fenced_writes_pkey PRIMARY KEY (write_id);


--
-- Name: held_tickets held_tickets_pkey; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.held_tickets
    ADD CONSTRAINT held_tickets_pkey PRIMARY KEY (block_id);


--
-- Name: high_water high_water_pkey; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.high_water
    ADD CONSTRAINT high_water_pkey PRIMARY KEY (singleton);


--
-- Name: leader_terms leader_terms_pkey; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.leader_terms
    ADD CONSTRAINT leader_terms_pkey PRIMARY KEY (generation, epoch);


--
-- Name: pool_resets pool_resets_pkey; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.pool_resets
    ADD CONSTRAINT pool_resets_pkey PRIMARY KEY (reset_id);


--
-- Name: pool_samples pool_samples_pkey; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.pool_samples
    ADD CONSTRAINT pool_samples_pkey PRIMARY KEY (sampled_at);


--
-- Name: serving_stretches serving_stretches_pkey; Type: CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.serving_stretches
    ADD CONSTRAINT serving_stretches_pkey PRIMARY KEY (stretch_id);


--
-- Name: claim_pauses_one_open; Type: INDEX; Schema: allocator; Owner: allocator_owner
--

CREATE UNIQUE INDEX claim_pauses_one_open ON allocator.claim_pauses USING btree ((true)) WHERE (resumed_at IS NULL);


--
-- Name: blocks blocks_disjoint_insert; Type: TRIGGER; Schema: allocator; Owner: allocator_owner
--

CREATE TRIGGER blocks_disjoint_insert AFTER INSERT ON allocator.blocks REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION allocator.blocks_disjoint();


--
-- Name: blocks blocks_ranges_fixed; Type: TRIGGER; Schema: allocator; Owner: allocator_owner
--

CREATE TRIGGER blocks_ranges_fixed BEFORE UPDATE OF first_id, last_id ON allocator.blocks FOR EACH ROW EXECUTE FUNCTION allocator.blocks_disjoint();


--
-- Name: claim_pause claim_pause_pause_id_fkey; Type: FK CONSTRAINT; Schema: allocator; Owner: allocator_owner
--

ALTER TABLE ONLY allocator.claim_pause
    ADD CONSTRAINT claim_pause_pause_id_fkey FOREIGN KEY (pause_id) REFERENCES allocator.claim_pauses(pause_id);


--
-- Name: SCHEMA allocator; Type: ACL; Schema: -; Owner: allocator_owner
--

GRANT USAGE ON SCHEMA allocator TO allocator_consumer;
GRANT USAGE ON SCHEMA allocator TO allocator_node;
GRANT USAGE ON SCHEMA allocator TO allocator_operator;


--
-- Name: FUNCTION age_bound_id(p_ahead_ms bigint, p_always boolean); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.age_bound_id(p_ahead_ms bigint, p_always boolean) FROM PUBLIC;


--
-- Name: FUNCTION available_blocks(OUT blocks bigint, OUT ids bigint); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.available_blocks(OUT blocks bigint, OUT ids bigint) FROM PUBLIC;


--
-- Name: FUNCTION block_age_status_row(); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.block_age_status_row() FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.block_age_status_row() TO allocator_consumer;
GRANT ALL ON FUNCTION allocator.block_age_status_row() TO allocator_node;
GRANT ALL ON FUNCTION allocator.block_age_status_row() TO allocator_operator;


--
-- Name: FUNCTION blocks_disjoint(); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.blocks_disjoint() FROM PUBLIC;


--
-- Name: FUNCTION check_layout(p_layout jsonb, p_recorded_by text); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.check_layout(p_layout jsonb, p_recorded_by text) FROM PUBLIC;


--
-- Name: FUNCTION claim_blocks(consumer text, n integer); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.claim_blocks(consumer text, n integer) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.claim_blocks(consumer text, n integer) TO allocator_consumer;


--
-- Name: FUNCTION claim_blocks_expiring(consumer text, n integer); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.claim_blocks_expiring(consumer text, n integer) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.claim_blocks_expiring(consumer text, n integer) TO allocator_consumer;


--
-- Name: FUNCTION claimed_block_ages(p_after_ticket bigint, p_upto_ticket bigint, p_limit integer); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.claimed_block_ages(p_after_ticket bigint, p_upto_ticket bigint, p_limit integer) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.claimed_block_ages(p_after_ticket bigint, p_upto_ticket bigint, p_limit integer) TO allocator_node;


--
-- Name: FUNCTION claims_in_flight(); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.claims_in_flight() FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.claims_in_flight() TO allocator_operator;


--
-- Name: FUNCTION cut_blocks(p_generation bigint, p_epoch bigint, p_first_ids bigint[], p_last_ids bigint[], p_layout jsonb, p_max_ahead_ms bigint); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.cut_blocks(p_generation bigint, p_epoch bigint, p_first_ids bigint[], p_last_ids bigint[], p_layout jsonb, p_max_ahead_ms bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.cut_blocks(p_generation bigint, p_epoch bigint, p_first_ids bigint[], p_last_ids bigint[], p_layout jsonb, p_max_ahead_ms bigint) TO allocator_node;


--
-- Name: FUNCTION db_now_ms(); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.db_now_ms() FROM PUBLIC;


--
-- Name: FUNCTION end_term(p_generation bigint, p_epoch bigint, p_reason text); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.end_term(p_generation bigint, p_epoch bigint, p_reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.end_term(p_generation bigint, p_epoch bigint, p_reason text) TO allocator_node;


--
-- Name: FUNCTION id_time_ms(p_id bigint); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.id_time_ms(p_id bigint) FROM PUBLIC;


--
-- Name: FUNCTION leader_heartbeat(p_generation bigint, p_epoch bigint, p_max_block_age_ms bigint, p_serve_aged_without_leader boolean, p_leader_stale_ms bigint); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.leader_heartbeat(p_generation bigint, p_epoch bigint, p_max_block_age_ms bigint, p_serve_aged_without_leader boolean, p_leader_stale_ms bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.leader_heartbeat(p_generation bigint, p_epoch bigint, p_max_block_age_ms bigint, p_serve_aged_without_leader boolean, p_leader_stale_ms bigint) TO allocator_node;


--
-- Name: FUNCTION lock_fence(p_generation bigint, p_epoch bigint); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.lock_fence(p_generation bigint, p_epoch bigint) FROM PUBLIC;


--
-- Name: FUNCTION pause_claims(p_reason text); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.pause_claims(p_reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.pause_claims(p_reason text) TO allocator_operator;


--
-- Name: FUNCTION pool_status_row(); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.pool_status_row() FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.pool_status_row() TO allocator_consumer;
GRANT ALL ON FUNCTION allocator.pool_status_row() TO allocator_node;
GRANT ALL ON FUNCTION allocator.pool_status_row() TO allocator_operator;


--
-- Name: FUNCTION prune_claimed(p_generation bigint, p_epoch bigint, p_retention_ms bigint, p_limit integer); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.prune_claimed(p_generation bigint, p_epoch bigint, p_retention_ms bigint, p_limit integer) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.prune_claimed(p_generation bigint, p_epoch bigint, p_retention_ms bigint, p_limit integer) TO allocator_node;


--
-- Name: FUNCTION rebase_fence(p_reason text); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.rebase_fence(p_reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.rebase_fence(p_reason text) TO allocator_operator;


--
-- Name: FUNCTION record_pool_sample(); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.record_pool_sample() FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.record_pool_sample() TO allocator_node;


--
-- Name: FUNCTION replication_status(OUT standbys integer, OUT synchronous_standbys integer, OUT synchronous_standby_names text, OUT synchronous_commit text, OUT in_recovery boolean); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.replication_status(OUT standbys integer, OUT synchronous_standbys integer, OUT synchronous_standby_names text, OUT synchronous_commit text, OUT in_recovery boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.replication_status(OUT standbys integer, OUT synchronous_standbys integer, OUT synchronous_standby_names text, OUT synchronous_commit text, OUT in_recovery boolean) TO allocator_node;
GRANT ALL ON FUNCTION allocator.replication_status(OUT standbys integer, OUT synchronous_standbys integer, OUT synchronous_standby_names text, OUT synchronous_commit text, OUT in_recovery boolean) TO allocator_operator;


--
-- Name: FUNCTION requeue_stranded(p_generation bigint, p_epoch bigint); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.requeue_stranded(p_generation bigint, p_epoch bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.requeue_stranded(p_generation bigint, p_epoch bigint) TO allocator_node;


--
-- Name: FUNCTION reset_after_restore(p_reason text, p_min_high_water_id bigint, p_max_ahead_ms bigint); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.reset_after_restore(p_reason text, p_min_high_water_id bigint, p_max_ahead_ms bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.reset_after_restore(p_reason text, p_min_high_water_id bigint, p_max_ahead_ms bigint) TO allocator_operator;


--
-- Name: FUNCTION resume_claims(p_reason text); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.resume_claims(p_reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.resume_claims(p_reason text) TO allocator_operator;


--
-- Name: FUNCTION take_fence(p_generation bigint, p_epoch bigint, p_holder text, p_host text, p_pid integer, p_layout jsonb); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.take_fence(p_generation bigint, p_epoch bigint, p_holder text, p_host text, p_pid integer, p_layout jsonb) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.take_fence(p_generation bigint, p_epoch bigint, p_holder text, p_host text, p_pid integer, p_layout jsonb) TO allocator_node;


--
-- Name: FUNCTION void_aged_blocks(p_generation bigint, p_epoch bigint, p_ahead_ms bigint, p_limit integer); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.void_aged_blocks(p_generation bigint, p_epoch bigint, p_ahead_ms bigint, p_limit integer) FROM PUBLIC;
GRANT ALL ON FUNCTION allocator.void_aged_blocks(p_generation bigint, p_epoch bigint, p_ahead_ms bigint, p_limit integer) TO allocator_node;


--
-- Name: FUNCTION voided_position(); Type: ACL; Schema: allocator; Owner: allocator_owner
--

REVOKE ALL ON FUNCTION allocator.voided_position() FROM PUBLIC;


--
-- Name: TABLE block_age_status; Type: ACL; Schema: allocator; Owner: allocator_owner
--

GRANT SELECT ON TABLE allocator.block_age_status TO allocator_consumer;
GRANT SELECT ON TABLE allocator.block_age_status TO allocator_node;
GRANT SELECT ON TABLE allocator.block_age_status TO allocator_operator;


--
-- Name: TABLE block_ledger; Type: ACL; Schema: allocator; Owner: allocator_owner
--

GRANT SELECT ON TABLE allocator.block_ledger TO allocator_operator;


--
-- Name: TABLE claim_pause_history; Type: ACL; Schema: allocator; Owner: allocator_owner
--

GRANT SELECT ON TABLE allocator.claim_pause_history TO allocator_node;
GRANT SELECT ON TABLE allocator.claim_pause_history TO allocator_operator;


--
-- Name: TABLE fence_history; Type: ACL; Schema: allocator; Owner: allocator_owner
--

GRANT SELECT ON TABLE allocator.fence_history TO allocator_node;
GRANT SELECT ON TABLE allocator.fence_history TO allocator_operator;


--
-- Name: TABLE fenced_writes; Type: ACL; Schema: allocator; Owner: allocator_owner
--

GRANT SELECT ON TABLE allocator.fenced_writes TO allocator_operator;


--
-- Name: TABLE held_tickets; Type: ACL; Schema: allocator; Owner: allocator_owner
--

GRANT SELECT ON TABLE allocator.held_tickets TO allocator_operator;


--
-- Name: TABLE layout; Type: ACL; Schema: allocator; Owner: allocator_owner
--

GRANT SELECT ON TABLE allocator.layout TO allocator_operator;


--
-- Name: TABLE leader_history; Type: ACL; Schema: allocator; Owner: allocator_owner
--

GRANT SELECT ON TABLE allocator.leader_history TO allocator_node;
GRANT SELECT ON TABLE allocator.leader_history TO allocator_operator;


--
-- Name: TABLE pool_resets; Type: ACL; Schema: allocator; Owner: allocator_owner
--

GRANT SELECT ON TABLE allocator.pool_resets TO allocator_operator;


--
-- Name: TABLE pool_status; Type: ACL; Schema: allocator; Owner: allocator_owner
--

GRANT SELECT ON TABLE allocator.pool_status TO allocator_consumer;
GRANT SELECT ON TABLE allocator.pool_status TO allocator_node;
GRANT SELECT ON TABLE allocator.pool_status TO allocator_operator;


--
-- Name: TABLE serving_history; Type: ACL; Schema: allocator; Owner: allocator_owner
--

GRANT SELECT ON TABLE allocator.serving_history TO allocator_node;
GRANT SELECT ON TABLE allocator.serving_history TO allocator_operator;


--
-- Name: DEFAULT PRIVILEGES FOR FUNCTIONS; Type: DEFAULT ACL; Schema: -; Owner: allocator_owner
--

ALTER DEFAULT PRIVILEGES FOR ROLE allocator_owner REVOKE ALL ON FUNCTIONS  FROM PUBLIC;

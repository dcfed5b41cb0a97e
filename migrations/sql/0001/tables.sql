-- allocator schema 0001: tables, sequence and views.
-- Executed by migrations/versions/0001_initial_schema.py; see its docstring for the design.

CREATE SCHEMA allocator;
COMMENT ON SCHEMA allocator IS 'Snowflake ID block allocator (see DESIGN.md section 6)';

-- The fence: one row. epoch = czxid of the current leader's election znode.
CREATE TABLE allocator.fence (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch      bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    holder     text,
    host       text,
    pid        integer,
    taken_at   timestamptz
);
INSERT INTO allocator.fence DEFAULT VALUES;

-- The high-water mark: one row, advanced by every cut, never moved back.
--   last_id      last Snowflake ID ever cut (inclusive); -1 before the first cut
--   last_ticket  highest claim ticket ever assigned to a block
--   requeued_upto every block with a ticket <= this is claimed, or is being claimed by a
--                transaction holding its row lock (maintained by requeue_stranded)
--   requeue_mark claim-ticket position seen by the previous requeue_stranded run
CREATE TABLE allocator.high_water (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_id        bigint NOT NULL DEFAULT -1 CHECK (last_id >= -1),
    last_ticket    bigint NOT NULL DEFAULT 0 CHECK (last_ticket >= 0),
    requeued_upto  bigint NOT NULL DEFAULT 0 CHECK (requeued_upto >= 0),
    requeue_mark   bigint NOT NULL DEFAULT 0 CHECK (requeue_mark >= 0),
    updated_at     timestamptz
);
INSERT INTO allocator.high_water DEFAULT VALUES;

-- Claim tickets: each claim draws the next ticket(s) and claims the block holding it by
-- primary-key-like lookup. CACHE 1 so pg_sequence_last_value() is exact for the cutter.
CREATE SEQUENCE allocator.claim_ticket AS bigint MINVALUE 1 START 1 CACHE 1 NO CYCLE;

CREATE TABLE allocator.blocks (
    block_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ticket      bigint NOT NULL,
    first_id    bigint NOT NULL CHECK (first_id >= 0),
    last_id     bigint NOT NULL,
    epoch       bigint NOT NULL,
    cut_at      timestamptz NOT NULL DEFAULT statement_timestamp(),
    claimed_by  text,
    claimed_at  timestamptz,
    CONSTRAINT blocks_range_valid CHECK (last_id >= first_id),
    CONSTRAINT blocks_claim_complete CHECK ((claimed_by IS NULL) = (claimed_at IS NULL)),
    CONSTRAINT blocks_ticket_unique UNIQUE (ticket),
    -- I1 enforced by the database: no two retained blocks overlap. A GiST exclusion
    -- constraint did this too, but cut at ~4k blocks/s and slowed as the table grew
    -- (ascending ranges are its worst case); the btree below plus the statement-level
    -- trigger allocator.blocks_disjoint (functions.sql) cut ~100k blocks/s.
    CONSTRAINT blocks_first_id_unique UNIQUE (first_id)
) WITH (fillfactor = 50);
COMMENT ON TABLE allocator.blocks IS
    'Cut blocks of Snowflake IDs; claims update claimed_by/claimed_at in place (HOT).';

-- Leader terms, one row per fence takeover.
CREATE TABLE allocator.leader_terms (
    epoch       bigint PRIMARY KEY,
    holder      text NOT NULL,
    host        text,
    pid         integer,
    elected_at  timestamptz NOT NULL DEFAULT statement_timestamp(),
    ended_at    timestamptz,
    end_reason  text,
    CONSTRAINT leader_terms_end_complete CHECK ((ended_at IS NULL) = (end_reason IS NULL))
);

-- Samples of the ticket positions, for the claim rate and runway (written by any node).
CREATE TABLE allocator.pool_samples (
    sampled_at       timestamptz PRIMARY KEY DEFAULT clock_timestamp(),
    claim_position   bigint NOT NULL,
    cut_position     bigint NOT NULL
);

CREATE VIEW allocator.block_ledger AS
SELECT b.block_id, b.first_id, b.last_id, b.last_id - b.first_id + 1 AS size,
       b.epoch, b.cut_at, b.claimed_by, b.claimed_at
  FROM allocator.blocks b;

CREATE VIEW allocator.leader_history AS
SELECT t.epoch, t.holder, t.host, t.pid, t.elected_at, t.ended_at, t.end_reason
  FROM allocator.leader_terms t;

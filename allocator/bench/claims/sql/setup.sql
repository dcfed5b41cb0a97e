-- Baselines of `allocator bench claims`, created in the bench's own template database.
-- (2) a plain FOR UPDATE SKIP LOCKED queue: the same row shape as allocator.blocks
--     (a block range + claimed_by/claimed_at), default fillfactor, only a primary key.
-- (3) a Leaf-style segment: one row per business tag, max_id bumped by step.
-- (4) a sequence with CACHE 100: not durable, the ceiling.
-- (5) durable_commit: a reference, not a claim method: one-row INSERTs into a table with no
--     index, each committed synchronously: the fastest any durable transaction goes here.
CREATE SCHEMA bench;

CREATE TABLE bench.skip_locked_queue (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    first_id    bigint NOT NULL,
    last_id     bigint NOT NULL,
    claimed_by  text,
    claimed_at  timestamptz
);

CREATE TABLE bench.segment (
    biz_tag     text PRIMARY KEY,
    max_id      bigint NOT NULL,
    step        integer NOT NULL,
    updated_at  timestamptz
);
INSERT INTO bench.segment (biz_tag, max_id, step, updated_at) VALUES ('x', 0, 4096, now());

CREATE SEQUENCE bench.id_seq AS bigint CACHE 100;

CREATE TABLE bench.durable_commit (n integer);

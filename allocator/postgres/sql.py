"""Every SQL statement the node and the operator commands send, by name; holders of SQL text
are this module and ``migrations/sql`` only.

Writes go through the schema's functions, never table DML (the node role has none), and
every statement is a single statement, so a fenced write's lock, check, insert and mark
advance commit together. Parameters are named (``%(name)s``); column names match the fields
of the record each maps to. The surface and the roles: docs/design.md §6, docs/sql.md.
"""

from __future__ import annotations

from typing import Final

# -- session setup (the pool's configure callback) ---------------------------------------

CONFIGURE_SESSION: Final = (
    "SELECT set_config('statement_timeout', %(statement_timeout)s, false),"
    " set_config('idle_in_transaction_session_timeout', %(idle_in_transaction_timeout)s, false),"
    " set_config('lock_timeout', %(lock_timeout)s, false),"
    " set_config('application_name', %(application_name)s, false)"
)
"""Session settings of a node connection; values are text (milliseconds for the timeouts)."""

SESSION_SETTINGS: Final = (
    "SELECT current_setting('statement_timeout') AS statement_timeout,"
    " current_setting('idle_in_transaction_session_timeout')"
    " AS idle_in_transaction_session_timeout,"
    " current_setting('lock_timeout') AS lock_timeout,"
    " current_setting('application_name') AS application_name"
)
"""What ``SHOW`` reports for the settings :data:`CONFIGURE_SESSION` makes."""

SET_LOCAL_LOCK_TIMEOUT: Final = "SELECT set_config('lock_timeout', %(lock_timeout)s, true)"
"""Overrides ``lock_timeout`` until the end of the current transaction."""

SET_LOCAL_STATEMENT_TIMEOUT: Final = (
    "SELECT set_config('statement_timeout', %(statement_timeout)s, true)"
)
"""Overrides ``statement_timeout`` until the end of the current transaction."""

PING: Final = "SELECT 1"

DB_CLOCK: Final = "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS db_ms"
"""The database server's clock in Unix milliseconds: the cluster's reference clock."""

VERSION_TABLE: Final = (
    "SELECT to_regclass('public.alembic_version') IS NOT NULL,"
    " obj_description(to_regclass('public.alembic_version'), 'pg_class')"
)
"""Whether Alembic's version table exists, and its comment (the compatibility marker,
:mod:`allocator.postgres.compat`): readable by every role."""

SCHEMA_REVISION: Final = "SELECT version_num FROM public.alembic_version"
"""The schema revision; ``allocator migrate`` grants the node and operator roles SELECT."""

REPLICATION_STATUS: Final = (
    "SELECT standbys, synchronous_standbys, synchronous_standby_names, synchronous_commit,"
    " in_recovery FROM allocator.replication_status()"
)
"""How the database replicates (migration 0005): nodes refuse to cut on async standbys."""

# -- the fence and block writes (node role) -----------------------------------------------

TAKE_FENCE: Final = (
    "SELECT high_water_id, previous_generation, previous_epoch"
    " FROM allocator.take_fence(%(generation)s, %(epoch)s, %(holder)s, %(host)s, %(pid)s,"
    " %(layout)s::jsonb)"
)
"""Takeover: checks the layout (AL104), moves the fence forward to the token (AL101 when it
is not newer), records the term, returns the persisted mark and the token it replaced."""

CUT_BLOCKS: Final = (
    "SELECT high_water_id, last_ticket, lead_ms"
    " FROM allocator.cut_blocks(%(generation)s, %(epoch)s, %(first_ids)s::bigint[],"
    " %(last_ids)s::bigint[], %(layout)s::jsonb, %(max_ahead_ms)s)"
)
"""One fenced write for a whole batch of blocks (AL100 fenced, AL102 behind the mark, AL103
malformed batch, AL104 other layout, AL105 past the database clock's bound); returns the new
high-water mark, the last ticket assigned and the mark's lead over the database clock."""

REQUEUE_STRANDED: Final = "SELECT allocator.requeue_stranded(%(generation)s, %(epoch)s) AS requeued"
"""Fenced: gives stranded unclaimed blocks fresh tickets; returns how many moved."""

PRUNE_CLAIMED: Final = (
    "SELECT allocator.prune_claimed(%(generation)s, %(epoch)s, %(retention_ms)s, %(limit)s)"
    " AS pruned"
)
"""Fenced retention (migrations 0002, 0003): deletes at most ``limit`` blocks claimed more
than ``retention_ms`` ago by the database clock, oldest claims first; never an unclaimed
block. Returns how many went."""

LEADER_HEARTBEAT: Final = (
    "SELECT allocator.leader_heartbeat(%(generation)s, %(epoch)s, %(max_block_age_ms)s,"
    " %(serve_aged_without_leader)s, %(leader_stale_ms)s) AS heartbeat_at"
)
"""Fenced (migration 0011): the leader serves, with its bound on an ID's age; returns the
heartbeat's time (the database clock)."""

VOID_AGED_BLOCKS: Final = (
    "SELECT allocator.void_aged_blocks(%(generation)s, %(epoch)s, %(ahead_ms)s, %(limit)s)"
    " AS voided"
)
"""Fenced (migration 0011): voids at most ``limit`` unclaimed blocks older than the bound minus
``ahead_ms``, oldest first, and moves the claim tickets past them; returns how many."""

END_TERM: Final = (
    "SELECT coalesce(allocator.end_term(%(generation)s, %(epoch)s, %(reason)s), false) AS ended"
)
"""Ends the caller's term in the leader history; false when that term was already ended or
never started (not fenced: it only annotates history)."""

RESET_AFTER_RESTORE: Final = (
    "SELECT voided_blocks, old_high_water_id, new_high_water_id, old_generation, old_epoch,"
    " new_generation FROM allocator.reset_after_restore(%(reason)s, %(min_high_water_id)s,"
    " %(max_ahead_ms)s)"
)
"""Operator (migration 0006): voids the unclaimed blocks, moves the mark, advances the
fence generation, audited in ``pool_resets``; the caller then writes the generation into
ZooKeeper."""

REBASE_FENCE: Final = (
    "SELECT old_generation, old_epoch, new_generation FROM allocator.rebase_fence(%(reason)s)"
)
"""Operator: advances the fence generation (audited in ``fence_rebases``); returns the old
token and the new generation, which the caller then writes into ZooKeeper."""

FENCE_HISTORY: Final = (
    "SELECT rebase_id, rebased_at, rebased_by, old_generation, old_epoch, new_generation, reason"
    " FROM allocator.fence_history ORDER BY rebase_id DESC LIMIT %(limit)s"
)
"""The latest ``limit`` re-bases, newest first."""

RECORD_POOL_SAMPLE: Final = "SELECT allocator.record_pool_sample()"
"""One sample of the ticket positions, for the claim rate behind ``runway_s``."""

# -- reads (node and operator roles) ------------------------------------------------------

POOL_STATUS: Final = (
    "SELECT available_blocks, available_ids, claim_rate_blocks_per_s, runway_s,"
    " high_water_id, cut_position, claim_position, epoch, holder, generation,"
    " mark_ahead_ms, mark_lead_ms, claims_paused"
    " FROM allocator.pool_status"
)
"""The pool's one row; ``claims_paused`` since migration 0010 (the view's last column)."""

BLOCK_AGE_STATUS: Final = (
    "SELECT max_block_age_ms, serve_aged_without_leader, heartbeat_at, leader_serves,"
    " oldest_unclaimed_age_ms FROM allocator.block_age_status"
)
"""The bound on an ID's age, whether a leader serves, the oldest unclaimed block's age
(migration 0011; every role may read it)."""

CLAIMED_BLOCK_AGES: Final = (
    "SELECT ticket, first_id, claimed_at_ms"
    " FROM allocator.claimed_block_ages(%(after_ticket)s, %(upto_ticket)s, %(limit)s)"
)
"""The blocks handed out with tickets in ``(after_ticket, upto_ticket]``, newest first, at most
``limit``, voided ones left out (migration 0011, node role): the age at hand-out."""

LEADER_HISTORY: Final = (
    "SELECT epoch, holder, host, pid, elected_at, ended_at, end_reason, generation"
    " FROM allocator.leader_history"
    " ORDER BY elected_at DESC, epoch DESC"
    " LIMIT %(limit)s"
)
"""The latest ``limit`` terms, newest first."""

FENCE_AND_HIGH_WATER: Final = (
    "SELECT epoch, holder, high_water_id, generation FROM allocator.pool_status"
)
"""The fence and the high-water mark, through the view (the roles cannot read the tables)."""

# -- pausing claims (operator role, migration 0010) ------------------------------------------

PAUSE_CLAIMS: Final = (
    "SELECT pause_id, paused_at, paused_by, reason, already_paused"
    " FROM allocator.pause_claims(%(reason)s)"
)
"""Pauses claims (``claim_blocks`` answers AL004), audited in ``claim_pause_history``;
returns the open pause (``already_paused`` when claims were paused before)."""

RESUME_CLAIMS: Final = (
    "SELECT pause_id, paused_at, paused_by, reason, resumed_at, resumed_by, resume_reason,"
    " was_paused FROM allocator.resume_claims(%(reason)s)"
)
"""Resumes claims, audited; ``was_paused`` false (and the rest NULL) when they were not."""

CLAIMS_IN_FLIGHT: Final = (
    "SELECT pid, virtualtransaction, usename, application_name, host(client_addr) AS"
    " client_addr, state, xact_start, state_change FROM allocator.claims_in_flight()"
)
"""Sessions whose open transaction holds a claim (``claim_blocks``' shared advisory lock)."""

OPEN_PAUSE: Final = (
    "SELECT pause_id, paused_at, paused_by, reason FROM allocator.claim_pause_history"
    " WHERE resumed_at IS NULL"
)
"""The open pause, if any (node and operator roles)."""

LAYOUT_AND_CLOCK: Final = (
    "SELECT l.epoch_ms, l.datacenter_bits + l.lane_bits + l.sequence_bits AS shift,"
    " floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS db_ms"
    " FROM allocator.layout l"
)
"""The recorded layout's epoch and timestamp shift with the database clock (no row before
the first takeover): what ``reset_after_restore``'s clock bound is computed from."""

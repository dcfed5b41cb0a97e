"""Claim ID blocks in the background and hand their IDs out from memory.

:class:`IdClient` (threads) and :class:`AsyncIdClient` (asyncio) give a Python application
Snowflake IDs at memory speed; ``allocator claim`` and the bench use :func:`claim_once`.

Modules: :mod:`~allocator.client.base` (errors, blocks, protocols, helpers),
:mod:`~allocator.client.claimers` (PostgreSQL and in-memory claimers, :func:`claim_once`),
:mod:`~allocator.client.buffer` (the buffer both clients share),
:mod:`~allocator.client.threaded` (:class:`IdClient`), :mod:`~allocator.client.aio`
(:class:`AsyncIdClient`). Import from here; the names below are the public surface.

Rules:

- Every ID comes from a block claimed with ``allocator.claim_blocks_expiring`` or, on a
  schema before migration 0011, ``allocator.claim_blocks`` (docs/sql.md); either is durable
  on return (I4). Nothing here cuts or invents IDs.
- Double buffer, like Leaf's segments: a *segment* is the blocks one claim returned (up to
  ``batch_blocks``). IDs are handed out from the current segment, block by block, ascending
  within each block. When ``refill_at`` (a fraction, by ID count) of the current segment is
  left, the next segment is claimed while the IDs keep flowing, so that ``next_id()``
  normally never waits on the database: :class:`IdClient` sends that claim from the
  caller's own thread without waiting and collects its answer at a later block boundary
  (see Latency); otherwise (asyncio, a pool, a custom claimer, the first claim, retries) a
  background claimer (thread or task) claims it. At most one claim is out and at most one
  segment prefetched; the claimer is otherwise idle.
- Sizing: at the peak rate, ``refill_at`` of a segment must outlast a claim (a durable
  commit: milliseconds, more on a busy server). The thread client collects a prefetch at
  the first block boundary after its answer arrived (with one block per segment: the
  segment's end); when that answer is late, the caller hands the claim to the claimer
  thread and also waits for that thread to get the GIL (up to
  ``sys.getswitchinterval()``, 5 ms, twice). With ``max_batch_blocks`` above
  ``batch_blocks`` the client doubles its claims, up to that bound, whenever a caller had
  to wait for a late prefetch (Leaf's dynamic step, growing only); it never shrinks them,
  so at most about two segments are lost at close.
- Hot path: ``next_id()`` is a lock acquire, an integer increment, three comparisons and a
  release, plus one monotonic clock read while the current block has a deadline (see Age
  bound); it allocates nothing but the returned int (and the clock's float). Switching
  blocks or segments, asking for a refill, dropping expired IDs, waiting and failing all
  happen on the slow path.
- Age bound: while the database enforces ``pool.max_block_age_s`` (docs/claiming-ids.md),
  each claimed block comes with ``expires_in_ms``: how long until its first ID passes the
  bound. The client gives each block a local deadline, its claim's start on the client's
  monotonic clock (when the query was sent, the conservative end) plus ``expires_in_ms``,
  and never hands out an ID of a block at or past it: before handing out, the slow path
  drops the rest of such blocks (the current one, the segment's others, the prefetched
  segment, and what a waiting ``take`` had gathered), then claims afresh. Dropped IDs are
  lost like unused ones: never reused, counted (``get_stats()``: ``ids_expired``,
  ``blocks_expired``; ``UnusedIds.expired`` at close) and logged with their ranges
  (``client_ids_expired``). The prefetch also runs by time: once ``refill_at`` of a
  segment's life (its claim's start to its first deadline) is left, the next segment is
  claimed, so a slow consumer moves to fresh blocks without waiting. A block without
  ``expires_in_ms`` (no bound in force, an older schema, a custom claimer) never expires.
  The claimers ask for ``claim_blocks_expiring`` once per own connection (for a pool, once)
  and fall back to ``claim_blocks`` on SQLSTATE 42883, so a new client works against an
  older schema.
- Order: IDs of one block ascend; blocks are used in the order they were claimed (the
  database hands out the oldest first), so one client's IDs normally increase, but nothing
  promises it (a block requeued after someone's rolled-back claim is older). Uniqueness is
  the guarantee, order is not. An ID's timestamp says when its block was cut, not when the
  ID was handed out.
- No hidden I/O: constructors only record and validate settings. The claimer starts on
  first use (``next_id``/``take``) or on ``start()``; ``with``/``async with`` start and
  close. ``start(wait=True)`` also waits for the first segment.
- Waiting: a caller that finds no ID left waits at most ``wait_timeout_s`` for the claimer.
  Then it raises :class:`PoolEmptyError` when the pool stayed empty (AL003),
  :class:`ClaimsPausedError` (a kind of :class:`PoolEmptyError`) when an operator had
  paused claims all along (AL004, ``allocator pool pause``), or
  :class:`~allocator.core.errors.DatabaseUnavailableError` when PostgreSQL could not be reached
  or the claim is still running. Errors that waiting will not cure fail waiting callers at
  once: AL001/AL002 (:class:`ClaimArgumentError`; the claimer then stops for good) and any
  other database error (permissions, missing schema: the claimer keeps retrying, so the
  client recovers once it is fixed). A call never hangs.
- Retries: the claimer retries failed claims with capped exponential backoff and jitter
  (:func:`backoff_delay`: from ``backoff_initial_s``, doubling, capped at ``backoff_max_s``,
  each delay drawn from its upper half); a success resets it.
- Errors are translated at the boundary (:func:`translate_claim_error`, keeping
  ``__cause__``): AL003 → :class:`PoolEmptyError`, AL004 → :class:`ClaimsPausedError`
  (retried like AL003), AL001/AL002 → :class:`ClaimArgumentError`,
  connection failures and timeouts → :class:`~allocator.core.errors.DatabaseUnavailableError`
  (retryable), anything else → :class:`~allocator.core.errors.DatabaseError`.
- Unused IDs are lost: ``close()`` stops the claimer and reports the IDs claimed but not
  handed out (:class:`UnusedIds`: count and ranges; ``expired``: how many were dropped
  earlier at their deadline). They stay recorded as claimed by this
  consumer and are never handed to anyone again, this client included. The same holds for
  a claim whose answer never arrived (connection lost after commit), for a claim still
  running when ``close()`` stopped waiting for it (``complete=False``; what it returns is
  logged as ``client_blocks_lost_after_close``), and for the IDs a ``take()`` had gathered
  when ``close()`` interrupted it. A claim that lands while ``close()`` waits is reported
  (one a caller's thread began included: ``close()`` has the claimer thread finish it).
- Latency: no GIL hand-over in the steady state. A claimer thread that wakes (for the
  trigger, and again when its query's answer arrives) needs the GIL; a ``next_id()``
  spinning in another thread is made to drop it and gets it back only when the OS runs it
  again, on a busy machine milliseconds later. So :class:`IdClient` keeps that thread
  asleep: the caller that hands out the trigger ID sends the claim itself
  (:meth:`NonBlockingClaimer.begin`: libpq's non-blocking send, microseconds), and callers
  look for the answer at each block boundary (``poll()``: one non-blocking read) and buffer
  it. It does so with its own connection from a conninfo string (or any
  :class:`NonBlockingClaimer`), once that connection is open, while no claim is out and
  the last one did not fail. The claimer thread does everything cold: the first claim and
  connecting, claims over a ``psycopg_pool`` pool or a plain :class:`Claimer`, retries with
  backoff after any failure (a failed begun claim included), and a begun claim whose answer
  is late: a caller that finds nothing buffered hands it over, and so does ``close()``;
  the thread waits in ``finish()`` on the socket (GIL released), for at most the statement
  timeout plus ``connect_timeout_s``, then carries on as after its own claims. One thread at
  a time uses the connection: the claimer thread from setting ``_claim_in_flight`` until
  clearing it (both under the client's lock) and never while a begun claim is out; a
  caller only under that lock, to begin (no claim in flight) or poll (a begun claim not
  yet handed over); after the hand-over only the claimer thread. Python code on another
  thread (a hand-over, a retry, an application thread) still costs the spinning caller the
  GIL. ``allocator bench client`` measures the worst calls next to the machine's own noise
  floor. ``get_stats()`` counts waits, times claims (a claim a caller collected: until
  collected) and says who ran them (``claims_begun``, ``claims_on_caller_thread``,
  ``claims_handed_over``, ``claims_on_claimer_thread``).
- Client-only install: ``pip install snowflake-block-allocator`` (without the ``node`` extra)
  brings psycopg, psycopg-pool and structlog only, so this package imports nothing else
  outside the standard library but :mod:`allocator.core.errors`, :mod:`allocator.core.redact`,
  :mod:`allocator.postgres.errors` and :mod:`allocator.core.logs`; never the node's modules
  (configuration, database layer, ZooKeeper). Checked by
  tests/integration/test_client_only_install.py.
- Sharing: :class:`IdClient` is safe to share among threads. :class:`AsyncIdClient` belongs
  to one event loop. Neither survives ``fork()``: in a child process every client inherited
  from the parent drops its buffered IDs (the parent keeps handing them out), leaves a
  claim the parent had out and the parent's connection alone, and refuses to work
  (:class:`ClientClosedError`); create clients after forking.
"""

from allocator.client.aio import AsyncIdClient
from allocator.client.base import (
    APPLICATION_NAME,
    CLAIM_BLOCKS,
    DEFAULT_BACKOFF_INITIAL_S,
    DEFAULT_BACKOFF_MAX_S,
    DEFAULT_BATCH_BLOCKS,
    DEFAULT_CLOSE_TIMEOUT_S,
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_REFILL_AT,
    DEFAULT_STATEMENT_TIMEOUT_MS,
    DEFAULT_WAIT_TIMEOUT_S,
    MAX_BATCH_BLOCKS,
    MAX_CONSUMER_CHARS,
    AsyncClaimer,
    Block,
    ClaimArgumentError,
    Claimer,
    ClaimsPausedError,
    ClientClosedError,
    NonBlockingClaimer,
    PoolEmptyError,
    Range,
    UnusedIds,
    backoff_delay,
    check_consumer,
    merge_ranges,
    translate_claim_error,
)
from allocator.client.claimers import (
    AsyncPostgresClaimer,
    InMemoryClaimer,
    PostgresClaimer,
    claim_once,
)
from allocator.client.threaded import IdClient

__all__ = [
    "APPLICATION_NAME",
    "CLAIM_BLOCKS",
    "DEFAULT_BACKOFF_INITIAL_S",
    "DEFAULT_BACKOFF_MAX_S",
    "DEFAULT_BATCH_BLOCKS",
    "DEFAULT_CLOSE_TIMEOUT_S",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_REFILL_AT",
    "DEFAULT_STATEMENT_TIMEOUT_MS",
    "DEFAULT_WAIT_TIMEOUT_S",
    "MAX_BATCH_BLOCKS",
    "MAX_CONSUMER_CHARS",
    "AsyncClaimer",
    "AsyncIdClient",
    "AsyncPostgresClaimer",
    "Block",
    "ClaimArgumentError",
    "Claimer",
    "ClaimsPausedError",
    "ClientClosedError",
    "IdClient",
    "InMemoryClaimer",
    "NonBlockingClaimer",
    "PoolEmptyError",
    "PostgresClaimer",
    "Range",
    "UnusedIds",
    "backoff_delay",
    "check_consumer",
    "claim_once",
    "merge_ranges",
    "translate_claim_error",
]

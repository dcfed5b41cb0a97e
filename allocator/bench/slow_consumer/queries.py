"""Every SQL statement of ``allocator bench slow-consumer``, in one named place.

Reads of the allocator's tables and calls of its fenced functions only
(``claim_blocks``, ``requeue_stranded``; the cut and the fence are
:mod:`allocator.bench.stock`'s); no write of an allocator table outside those functions.
"""

from __future__ import annotations

from typing import Final

POOL_STATUS: Final = "SELECT * FROM allocator.pool_status"
POOL_LEVEL: Final = "SELECT available_blocks FROM allocator.pool_status"
REQUEUE: Final = "SELECT allocator.requeue_stranded(0, %s)"
FLOOR: Final = "SELECT requeued_upto, requeue_mark FROM allocator.high_water"
POSITION: Final = (
    "SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END FROM allocator.claim_ticket s"
)
HAS_HELD_TICKETS: Final = "SELECT to_regclass('allocator.held_tickets') IS NOT NULL"
HIGH_WATER_PAGES: Final = (
    "SELECT pg_relation_size('allocator.high_water') / current_setting('block_size')::int"
)

HOLD_CLAIM: Final = "SELECT block_id FROM allocator.claim_blocks(%s, 1)"
SHOW_IDLE_BOUND: Final = "SHOW idle_in_transaction_session_timeout"
LIFT_IDLE_BOUND: Final = "SET LOCAL idle_in_transaction_session_timeout = 0"
IN_HELD_TICKETS: Final = "SELECT 1 FROM allocator.held_tickets WHERE block_id = %s"
BACK_IN_QUEUE: Final = (
    "SELECT b.claimed_at IS NULL AND b.ticket > (" + POSITION + ")"
    " FROM allocator.blocks b WHERE b.block_id = %s"
)
DRAIN: Final = "SELECT block_id FROM allocator.claim_blocks('bench-drain', 1000)"

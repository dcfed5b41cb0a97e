"""Every statement the drill runs, in one place. The drill reads, never writes (the fence row,
the pool's level; a superuser or a reader's URL), and nothing here names a table the claim
path writes; the verdict's reads are :mod:`allocator.postgres.ledger`'s.
"""

from __future__ import annotations

from typing import Final

READ_FENCE: Final = "SELECT epoch, holder, pid FROM allocator.fence"
"""The fence row, cheaply (``pool_status`` would also count the pool at every poll)."""

READ_AVAILABLE_BLOCKS: Final = "SELECT available_blocks FROM allocator.pool_status"

READ_POOL: Final = (
    "SELECT p.available_blocks, p.runway_s,"
    " (SELECT b.epoch FROM allocator.blocks b ORDER BY b.block_id DESC LIMIT 1)"
    " FROM allocator.pool_status p"
)
"""The pool's level and runway, and the epoch of the newest cut (the primary key's order is
cut order, so this reads one index entry)."""

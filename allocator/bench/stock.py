"""What every bench stocks a pool with: the layout, the epoch and the fenced SQL calls.

Blocks reach a bench database only through the fenced functions, as a leader would
(``take_fence`` once, then ``cut_blocks``; ``leader_heartbeat`` for a bound on an ID's
age), with the default layout at datacenter 0; the SQL calls live here, in one named place.
"""

from __future__ import annotations

import json
from typing import Final

from allocator.core.layout import Layout

BLOCK_SIZE_IDS = 4096
EPOCH = 1
BENCH_LAYOUT = Layout()
LAYOUT_JSON = json.dumps(BENCH_LAYOUT.record(0))
"""The default layout, datacenter 0: what ``cut_blocks`` records and checks (migration 0003)."""

TAKE_FENCE: Final = "SELECT * FROM allocator.take_fence(0, %s, 'bench', 'localhost', %s, %s)"
"""Parameters: epoch, the bench's pid, :data:`LAYOUT_JSON`."""
CUT_BLOCKS: Final = "SELECT * FROM allocator.cut_blocks(0, %s, %s, %s, %s, 1000)"
"""Parameters: epoch, first IDs, last IDs, :data:`LAYOUT_JSON`."""
LEADER_HEARTBEAT: Final = "SELECT allocator.leader_heartbeat(0, %s, %s, false, %s)"
"""Parameters: epoch, max_block_age_ms, leader_stale_ms. ``serve_aged_without_leader`` off:
the bound stays in force without further heartbeats (migration 0011)."""
NO_BLOCK_OLDER_MS: Final = 2**53
"""A bench's bound on an ID's age (~285,000 years, past the layout's epoch): in force, so
``claim_blocks`` takes the path a serving cluster's claims take, and voids no stocked block
(their IDs date from the layout's epoch, which a real bound would void)."""

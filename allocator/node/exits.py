"""The node's exit codes (``allocator run``): rows of the one table
(:mod:`allocator.core.exits`); 69/70/75 as for every command."""

from __future__ import annotations

from allocator.core.exits import Exit

EXIT_OK = Exit.OK
"""Stopped on request."""
EXIT_SESSION_LOST = Exit.SESSION_LOST
"""The ZooKeeper session was lost (``node.on_session_loss = "exit"``)."""
EXIT_FENCED = Exit.FENCED
"""A newer leader holds the fence: nothing of ours may be written any more."""
EXIT_CONFIG = Exit.CONFIG
"""A configuration the cluster refuses (a layout mismatch)."""

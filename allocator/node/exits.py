"""The node's exit codes (``allocator run``); 69/70/75 as for every command."""

from __future__ import annotations

from allocator.core.errors import ConfigError

EXIT_OK = 0
"""Stopped on request."""
EXIT_SESSION_LOST = 3
"""The ZooKeeper session was lost (``node.on_session_loss = "exit"``)."""
EXIT_FENCED = 4
"""A newer leader holds the fence: nothing of ours may be written any more."""
EXIT_CONFIG = ConfigError.exit_code
"""A configuration the cluster refuses (a layout mismatch)."""

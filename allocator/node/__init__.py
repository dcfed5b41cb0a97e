"""An allocator node (``allocator run``): election, fence takeover, leader jobs, self-stop.

:class:`Node` composes collaborators with one job each (session, session record, probe,
candidacy, blockers, watermark, leading with handover and the term-end table);
docs/architecture.md draws them, docs/design.md §4 gives the states they move through.
"""

from allocator.node.exits import EXIT_CONFIG, EXIT_FENCED, EXIT_OK, EXIT_SESSION_LOST
from allocator.node.node import Node
from allocator.node.pacing import Pacing

__all__ = ["EXIT_CONFIG", "EXIT_FENCED", "EXIT_OK", "EXIT_SESSION_LOST", "Node", "Pacing"]

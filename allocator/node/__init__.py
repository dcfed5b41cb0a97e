"""An allocator node (``allocator run``): election, fence takeover, leader jobs, self-stop.

The node is a set of collaborators, each with one job, composed by :class:`Node`:
:mod:`~allocator.node.session` (the ZooKeeper session, rejoin),
:mod:`~allocator.node.session_record` (the session file, reaping),
:mod:`~allocator.node.probe` (database probe, advert, election scan),
:mod:`~allocator.node.candidacy` (first in line: take the fence or say why not),
:mod:`~allocator.node.blockers` (why not), :mod:`~allocator.node.watermark` (ZooKeeper's
copy of the database), :mod:`~allocator.node.leading` (the term) with
:mod:`~allocator.node.handover` and :mod:`~allocator.node.term_end` (the term-end table).
docs/architecture.md draws them.
"""

from allocator.node.exits import EXIT_CONFIG, EXIT_FENCED, EXIT_OK, EXIT_SESSION_LOST
from allocator.node.node import Node
from allocator.node.pacing import Pacing

__all__ = ["EXIT_CONFIG", "EXIT_FENCED", "EXIT_OK", "EXIT_SESSION_LOST", "Node", "Pacing"]

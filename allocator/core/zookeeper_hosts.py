"""A ZooKeeper hosts string (``zk1:2181,zk2:2181/a/b``): its servers and its chroot.

The one parser of it: the configuration, the nodes, the operator commands and the reaper
split it here.
"""

from __future__ import annotations


def split_hosts(hosts: str) -> tuple[str, str]:
    """``zk1:2181,zk2:2181/a/b`` → (``zk1:2181,zk2:2181``, ``/a/b``); no chroot → ``""``
    (a trailing slash is no chroot of its own: ``/a/b/`` is ``/a/b``)."""
    servers, slash, chroot = hosts.partition("/")
    return servers, (slash + chroot).rstrip("/")


def servers_of(hosts: str) -> str:
    """The servers alone, for a client that must not use the chroot."""
    return split_hosts(hosts)[0]


def chroot_of(hosts: str) -> str:
    """The chroot alone (``zk1:2181/a/b`` → ``/a/b``), or ``""``."""
    return split_hosts(hosts)[1]

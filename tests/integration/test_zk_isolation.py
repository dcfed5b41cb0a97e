"""Each test gets its own ZooKeeper chroot on the shared ensemble."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from allocator.local.info import ClusterInfo

pytestmark = pytest.mark.integration


def connect(hosts: str) -> KazooClient:
    client = KazooClient(hosts=hosts, timeout=15.0)
    client.start(timeout=15.0)
    return client


def test_chroot_hides_other_tests_paths(cluster: ClusterInfo, zk_hosts: str) -> None:
    chroot = zk_hosts[len(cluster.zk_hosts) :]
    outsider = connect(cluster.zk_hosts)
    mine = connect(zk_hosts)
    try:
        outsider.ensure_path("/election")
        outsider.create("/election/someone-else", b"x", ephemeral=True)
        assert not mine.exists("/election")
        mine.create("/election/n_", b"me", ephemeral=True, sequence=True, makepath=True)
        assert len(mine.get_children("/election")) == 1
        outsider.sync(f"{chroot}/election")  # another session: its server may lag
        assert outsider.get_children(f"{chroot}/election")
    finally:
        for client in (mine, outsider):
            client.stop()
            client.close()
        root = connect(cluster.zk_hosts)
        root.delete("/election", recursive=True)
        root.stop()
        root.close()

"""Election on a real 3-server ensemble: one watcher per znode, one wake-up per exit."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from allocator.local.info import ClusterInfo
from allocator.local.zookeeper import four_letter_word
from allocator.zookeeper.election import Election, Identity, read_contenders

pytestmark = pytest.mark.integration

CONTENDERS = 5
DEADLINE_S = 20.0


def watchers_by_path(cluster: ClusterInfo) -> dict[str, int]:
    """Sum of `wchp` (watches by path) over every server of the ensemble."""
    counts: dict[str, int] = {}
    for server in cluster.zk_servers:
        path = None
        for line in four_letter_word(server.client_port, "wchp").splitlines():
            if line.startswith("/"):
                path = line.strip()
                counts.setdefault(path, 0)
            elif line.strip().startswith("0x") and path is not None:
                counts[path] += 1
    return counts


@pytest.fixture
def clients(zk_hosts: str) -> Iterator[list[KazooClient]]:
    made = []
    for _ in range(CONTENDERS):
        client = KazooClient(hosts=zk_hosts, timeout=10.0)
        client.start(timeout=15.0)
        made.append(client)
    yield made
    for client in made:
        client.stop()
        client.close()


def test_followers_watch_only_their_predecessor_and_exit_wakes_one(
    cluster: ClusterInfo, zk_hosts: str, clients: list[KazooClient]
) -> None:
    chroot = zk_hosts[len(cluster.zk_hosts) :]
    elections = [
        Election(client, "/election", Identity(f"node-{i}", "localhost", os.getpid(), ""))
        for i, client in enumerate(clients)
    ]
    for election in elections:
        election.join()
    stop = threading.Event()
    became_first = [threading.Event() for _ in elections]

    def contend(i: int) -> None:
        if elections[i].wait_until_first(stop, recheck_s=60.0):
            became_first[i].set()

    threads = [threading.Thread(target=contend, args=(i,), daemon=True) for i in range(5)]
    for thread in threads:
        thread.start()
    assert became_first[0].wait(DEADLINE_S)

    def election_watches() -> dict[str, int]:
        return {
            path: n
            for path, n in watchers_by_path(cluster).items()
            if path.startswith(f"{chroot}/election/")
        }

    pause = threading.Event()
    for _ in range(200):  # wait for the 4 followers to have registered their watch
        if sum(election_watches().values()) >= CONTENDERS - 1:
            break
        pause.wait(0.05)
    watches = election_watches()
    assert sum(watches.values()) == CONTENDERS - 1
    assert max(watches.values()) == 1  # at most one watcher per election znode
    clients[0].sync("/election")  # its server may lag behind the other sessions' creates
    order = [c.znode for c in read_contenders(clients[0], "/election")]
    assert order == [e.znode for e in elections]
    # followers watch exactly their predecessors
    assert set(watches) == {f"{chroot}{znode}" for znode in order[:-1]}

    elections[0].leave()
    assert became_first[1].wait(DEADLINE_S)
    assert [e.wakeups for e in elections[1:]] == [1, 0, 0, 0]
    assert not any(event.is_set() for event in became_first[2:])
    stop.set()
    for election in elections:
        election.leave()  # each deletion wakes its one watcher, which then sees `stop`
    for thread in threads:
        thread.join(timeout=DEADLINE_S)
        assert not thread.is_alive()


def test_token_is_the_czxid_of_our_own_node(zk_hosts: str, clients: list[KazooClient]) -> None:
    first = Election(clients[0], "/election", Identity("a", "h", 1, ""))
    second = Election(clients[1], "/election", Identity("b", "h", 2, ""))
    first.join()
    second.join()
    token_a, token_b = first.token(), second.token()
    assert token_a == clients[0].exists(first.znode).czxid
    assert token_b > token_a  # zxids order every write in the ensemble
    assert first.still_ours()
    first.leave()
    assert not first.still_ours()
    # Another session may be served by another server, which can lag: read_contenders
    # sync()s first, as ZooKeeper requires for read-your-other-session's-writes.
    assert [c.identity.name for c in read_contenders(clients[1], "/election")] == ["b"]
    assert read_contenders(clients[1], "/no-election-here") == []

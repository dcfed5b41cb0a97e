"""ZooKeeper ACLs and the election queue on a real ensemble (issue 10, must-shows 1 and 2).

A node runs with ``zookeeper.auth`` (the default path) in a chroot of its own; a second,
unauthenticated kazoo client then tries what an intruder would. And junk left in the
election before the ACLs (a persistent lookalike that sorts first, a foreign name, an
ephemeral entry with garbage data) changes nobody's place and is reported.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import READ_ACL_UNSAFE, make_digest_acl

from allocator import cli, fence
from allocator.cluster_status import gather
from allocator.config import Config, load_config
from allocator.node import Node
from allocator.zookeeper import client as zkclient
from tests.fixtures import zk
from tests.fixtures.nodes import wait_for

pytestmark = pytest.mark.integration

DEADLINE_S = 30.0
USER, PASSWORD = zk.ZK_AUTH.split(":", 1)
OURS = make_digest_acl(USER, PASSWORD, all=True)


def node_config(zk_hosts: str, db_url: str, **overrides: object) -> Config:
    return load_config(
        None,
        {
            "zookeeper.hosts": zk_hosts,
            "zookeeper.auth": zk.ZK_AUTH,
            "zookeeper.session_timeout_ms": 2000,
            "postgres.url": db_url,
            "node.name": "secure",
            "node.admin_address": "127.0.0.1:0",
            "pool.min_blocks": 8,
            "pool.low_watermark_blocks": 2,
            **overrides,
        },
        env={},
    )


@pytest.fixture
def stranger(zk_hosts: str) -> Iterator[KazooClient]:
    """An unauthenticated client of the test's chroot."""
    client = KazooClient(hosts=zk_hosts, timeout=10.0)
    client.start(timeout=15.0)
    yield client
    client.stop()
    client.close()


def leading(node: Node) -> bool:
    return node.role == "leader"


def test_an_unauthenticated_client_can_do_nothing_to_a_secured_node(
    zk_hosts: str, db_url: str, run_node: Callable[[Config], Node], stranger: KazooClient
) -> None:
    config = node_config(zk_hosts, db_url)
    node = run_node(config)
    wait_for(lambda: leading(node), "the node to lead")
    znode = node.snapshot()["znode"]
    assert znode is not None
    generation = fence.generation_path("/election")
    owner = zkclient.client(config)  # as `fence rebase` and `pool reset` build theirs
    owner.start(timeout=15.0)
    try:
        for path in ("/", "/election", znode):
            acl, _stat = owner.get_acls(path)
            assert zkclient.same_acl(acl, [OURS]), path
        owner.ensure_path(generation)
        assert zkclient.same_acl(owner.get_acls(generation)[0], [OURS])
    finally:
        owner.stop()
        owner.close()

    attempts: list[Callable[[], object]] = [
        lambda: stranger.create(f"/election/n-{uuid.uuid4().hex}-", b"", sequence=True),
        lambda: stranger.create("/election/n-x-0000000000", b""),
        lambda: stranger.delete(znode),
        lambda: stranger.set(znode, b'{"admin": "http://127.0.0.1:1"}'),
        lambda: stranger.set_acls(znode, list(READ_ACL_UNSAFE)),
        lambda: stranger.get(znode),
        lambda: stranger.get_children("/election"),
        lambda: stranger.set(generation, b"99"),
        lambda: stranger.delete(generation),
        lambda: stranger.create("/intruder", b""),  # "/" is the chroot
    ]
    for attempt in attempts:
        with pytest.raises(NoAuthError):
            attempt()
    assert leading(node)

    # An operator without the identity, or with a wrong password: one line, exit 78.
    for auth in ({}, {"ALLOCATOR_ZOOKEEPER_AUTH": f"{USER}:wrong-password"}):
        env = {"ALLOCATOR_ZOOKEEPER_HOSTS": zk_hosts, "ALLOCATOR_POSTGRES_URL": db_url, **auth}
        result = CliRunner().invoke(cli.main, ["status"], env=env)
        assert result.exit_code == 78, result.output
        assert result.output.startswith("error: read the election: ZooKeeper at ")
        assert "refused access; check zookeeper.auth" in result.output
        assert result.output.count("\n") == 1
        assert "wrong-password" not in result.output


def test_with_world_read_a_stranger_reads_but_cannot_write(
    zk_hosts: str, db_url: str, run_node: Callable[[Config], Node], stranger: KazooClient
) -> None:
    node = run_node(node_config(zk_hosts, db_url, **{"zookeeper.world_readable": True}))
    wait_for(lambda: leading(node), "the node to lead")
    znode = node.snapshot()["znode"]
    data, _stat = stranger.get(znode)
    assert b'"name": "secure"' in data
    assert stranger.get_children("/election") == [znode.rsplit("/", 1)[1]]
    with pytest.raises(NoAuthError):
        stranger.set(znode, b"{}")
    with pytest.raises(NoAuthError):
        stranger.delete(znode)
    with pytest.raises(NoAuthError):
        stranger.create(f"/election/n-{uuid.uuid4().hex}-", b"", sequence=True)


def test_junk_left_before_the_acls_changes_no_place_and_is_reported(
    zk_hosts: str, db_url: str, run_node: Callable[[Config], Node], stranger: KazooClient
) -> None:
    # As an unauthenticated client could before this version: the election path open,
    # a persistent lookalike that sorts first, a foreign name, and a live squatter (an
    # ephemeral in our format) whose data is garbage.
    stranger.ensure_path("/election")
    lookalike = stranger.create(f"/election/n-{uuid.uuid4().hex}-0000000000", b"{}")
    stranger.create("/election/not-ours", b"")
    squatter = KazooClient(hosts=zk_hosts, timeout=10.0)
    squatter.start(timeout=15.0)
    try:
        junk = squatter.create(
            f"/election/n-{uuid.uuid4().hex}-", b"1e400", ephemeral=True, sequence=True
        )
        config = node_config(zk_hosts, db_url)
        node = run_node(config)
        wait_for(lambda: node.snapshot()["znode"], "the node to join")
        with pytest.raises(NoAuthError):  # taken over at the node's start
            stranger.get_children("/election")
        with pytest.raises(NoAuthError):
            stranger.create(f"/election/n-{uuid.uuid4().hex}-", b"", sequence=True)

        report = gather(config).to_json()
        assert [c["znode"] for c in report["contenders"]] == [junk, node.snapshot()["znode"]]
        assert report["election"]["unparsable"] == [
            {"znode": junk, "problem": "a JSON number, not an object"}
        ]
        assert {e["znode"] for e in report["election"]["ignored"]} == {
            lookalike,
            "/election/not-ours",
        }
        assert report["contenders"][0]["problem"] is not None
        assert not leading(node)  # the squatter is ahead and alive: it keeps its place
        metrics = node.metrics.registry
        wait_for(
            lambda: metrics.get_sample_value("allocator_election_unparsable_znodes") == 1,
            "the node to report the squatter",
        )
        assert metrics.get_sample_value("allocator_election_ignored_znodes") == 2
    finally:
        squatter.stop()
        squatter.close()
    wait_for(lambda: leading(node), "the node to lead once the squatter is gone")

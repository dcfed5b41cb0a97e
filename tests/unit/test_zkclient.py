"""ZooKeeper access rules without servers (issue 10, must show 1): the ACL of what the
cluster creates, how every client is built, and the refuse-to-start rule at the CLI
(driven in-process with click's ``CliRunner``)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from click.testing import CliRunner, Result
from kazoo.security import READ_ACL_UNSAFE, make_acl, make_digest_acl

from allocator import cli, fence
from allocator.config import Config, load_config
from allocator.core.errors import ConfigError
from allocator.core.exits import Exit
from allocator.zookeeper import client as zkclient
from tests.fakes import FakeEnsemble

AUTH = "cluster-eu1:s3cr3t-zk-password"
OURS = make_digest_acl("cluster-eu1", "s3cr3t-zk-password", all=True)


def config(**overrides: object) -> Config:
    return load_config(None, {key.replace("__", "."): v for key, v in overrides.items()}, env={})


def invoke(*args: str, env: Mapping[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli.main, list(args), env=dict(env or {}))


def test_the_acl_grants_the_identity_everything_and_nobody_else_anything() -> None:
    assert zkclient.acl(config(zookeeper__auth=AUTH)) == [OURS]
    assert zkclient.acl(config(zookeeper__auth=AUTH, zookeeper__world_readable=True)) == [
        OURS,
        *READ_ACL_UNSAFE,
    ]
    assert zkclient.acl(config(zookeeper__insecure=True)) is None


def test_a_sasl_identity_has_every_right_and_readers_read_only() -> None:
    reader = "digest:ops:wsFsZ+HOM0zKzAMDjR8RyAEH/bU="  # sha1 of ops:ops-pw
    cfg = config(
        zookeeper__sasl_username="nodes",
        zookeeper__sasl_password="nodes-pw",
        zookeeper__readers=f"{reader},sasl:auditor",
    )
    assert zkclient.acl(cfg) == [
        make_acl("sasl", "nodes", all=True),
        make_acl("digest", reader.removeprefix("digest:"), read=True),
        make_acl("sasl", "auditor", read=True),
    ]
    assert zkclient.credentials(cfg) == ("nodes", "nodes-pw")
    zkclient.check_node(cfg)  # a SASL identity is enough for a node
    both = config(zookeeper__auth=AUTH, zookeeper__sasl_username="n", zookeeper__sasl_password="p")
    assert zkclient.acl(both) == [OURS, make_acl("sasl", "n", all=True)]


def test_every_client_authenticates_and_only_a_chrooted_one_has_a_default_acl() -> None:
    cfg = config(zookeeper__auth=AUTH, zookeeper__hosts="zk1:2181,zk2:2181/allocator/eu1")
    inside = zkclient.client(cfg)
    root = zkclient.client(cfg, chroot=False)
    try:
        assert inside.auth_data == {("digest", AUTH)}
        assert root.auth_data == {("digest", AUTH)}
        assert inside.default_acl == [OURS]
        assert root.default_acl is None  # the chroot's parents are not ours
        assert inside.chroot == "/allocator/eu1"
        assert root.chroot == ""
    finally:
        inside.close()
        root.close()


def test_owned_paths_are_the_chroot_and_below_never_its_parents() -> None:
    cfg = config(zookeeper__hosts="zk1/allocator/eu1", zookeeper__election_path="/a/election")
    assert zkclient.owned_paths(cfg) == [
        "/",  # the chroot itself, as a chrooted client addresses it
        "/a",
        "/a/election",
        fence.generation_path("/a/election"),
        fence.watermark_path("/a/election"),
    ]
    assert "/" not in zkclient.owned_paths(config(zookeeper__hosts="zk1:2181"))


def test_a_node_adds_new_readers_to_the_znodes_an_earlier_config_made() -> None:
    # An existing cluster: its znodes carry the identity alone. A node started with
    # zookeeper.readers gives the persistent ones the readers' READ (ADMIN is the identity's).
    ensemble = FakeEnsemble()
    owner = ensemble.client(auth=AUTH, default_acl=[OURS])
    owner.start()
    try:
        for path in ("/election", fence.generation_path("/election")):
            owner.create_async(path, b"").get()
        reader = "sasl:ops"
        cfg = config(zookeeper__auth=AUTH, zookeeper__readers=reader)
        changed = zkclient.secure(owner, cfg, lambda p: p.get())
        assert changed == ["/election", fence.generation_path("/election")]
        wanted = [OURS, make_acl("sasl", "ops", read=True)]
        assert owner.get_acls_async("/election").get()[0] == wanted
        assert zkclient.secure(owner, cfg, lambda p: p.get()) == []  # once
    finally:
        owner.stop()
        owner.close()


def test_ensure_chroot_gives_only_the_chroot_our_acl() -> None:
    ensemble = FakeEnsemble()
    root = ensemble.client(auth=AUTH)
    root.start()
    try:
        created = zkclient.ensure_chroot(root, "/shared/eu1", [OURS], lambda p: p.get())
        assert created
        assert root.get_acls_async("/shared/eu1").get()[0] == [OURS]
        parent_acl = root.get_acls_async("/shared").get()[0]
        assert not zkclient.same_acl(parent_acl, [OURS])  # open, as others may share it
        assert not zkclient.ensure_chroot(root, "/shared/eu1", [OURS], lambda p: p.get())
    finally:
        root.stop()
        root.close()


def test_a_node_refuses_to_start_without_auth_unless_insecure() -> None:
    with pytest.raises(ConfigError, match=r"zookeeper\.auth is not set"):
        zkclient.check_node(config())
    zkclient.check_node(config(zookeeper__insecure=True))
    zkclient.check_node(config(zookeeper__auth=AUTH))
    assert zkclient.warnings(config(zookeeper__auth=AUTH)) == []
    assert zkclient.warnings(config(zookeeper__insecure=True)) == [zkclient.INSECURE_CHECK_WARNING]
    assert "refuses to start" in zkclient.warnings(config())[0]


def test_run_check_refuses_without_auth_in_one_line() -> None:
    result = invoke("run", "--check")
    assert result.exit_code == 78
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: zookeeper.auth is not set")


def test_run_check_with_insecure_warns() -> None:
    result = invoke("run", "--check", env={"ALLOCATOR_ZOOKEEPER_INSECURE": "true"})
    assert result.exit_code == 0
    assert "warning: zookeeper.insecure is set: a node would run without" in result.output


def test_run_check_with_auth_from_the_environment_is_quiet_and_masks_it() -> None:
    result = invoke("run", "--check", env={"ALLOCATOR_ZOOKEEPER_AUTH": AUTH})
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output
    assert "s3cr3t" not in result.output


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"ALLOCATOR_ZOOKEEPER_INSECURE": "true"}, "a node would run without ZooKeeper ACLs"),
        ({}, "`allocator run` refuses to start"),
    ],
)
def test_config_check_says_when_a_node_would_run_without_acls(
    env: dict[str, str], expected: str
) -> None:
    result = invoke("config", "check", env=env)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert expected in warnings[0]


def test_set_cannot_carry_the_zookeeper_identity() -> None:
    result = invoke("status", "--set", f"zookeeper.auth={AUTH}")
    assert result.exit_code == Exit.USAGE
    assert "ALLOCATOR_ZOOKEEPER_AUTH" in result.output
    assert "s3cr3t" not in result.output

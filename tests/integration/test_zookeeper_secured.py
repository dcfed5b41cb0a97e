"""A secured ZooKeeper (issue 24, item 2): TLS with the servers verified against our CA (a
client certificate too), SASL DIGEST-MD5, and a read-only operator identity beside the
nodes' all-rights one, on a real server of Debian's ZooKeeper 3.8.

One server per module, started by the embedded cluster's own code with
:class:`allocator.local.zookeeper.Secured`: a plain client port and a TLS
``secureClientPort`` on 127.0.0.1, SASL users ``nodes`` (the cluster) and ``ops`` (a reader).
"""

from __future__ import annotations

import gc
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from kazoo.security import OPEN_ACL_UNSAFE, make_acl, make_digest_acl_credential

from allocator import cli, fence
from allocator.commands.run import build_node
from allocator.config import Config, env_name, load_config, secret_file_env
from allocator.core.errors import ConfigError
from allocator.local import processes, tcp_ports
from allocator.local import zookeeper as zkserver
from allocator.node import Node
from allocator.zookeeper import calls
from allocator.zookeeper import client as zkclient
from allocator.zookeeper.security import Sasl, Transport
from tests.fixtures.nodes import wait_for
from tests.fixtures.tls import write_pki

pytestmark = pytest.mark.integration

DEADLINE_S = 30.0
NODES_PASSWORD = "nodes-sasl-password"
OPS_PASSWORD = "ops-sasl-password"
AUDIT = ("audit", "audit-digest-password")
"""A digest reader: its ACL names the hash, its operator has the password."""
READERS = f"sasl:ops,digest:{make_digest_acl_credential(*AUDIT)}"
REFUSED_READER = (
    r"^rebase the fence: ZooKeeper at \S+ refused access; check zookeeper.auth / "
    r"zookeeper.sasl_username \(this client: sasl:ops .*one of zookeeper.readers may only read"
)


@dataclass(frozen=True)
class SecuredZooKeeper:
    plain: str
    """``127.0.0.1:<clientPort>``."""
    tls: str
    """``127.0.0.1:<secureClientPort>``."""
    pki: Path


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredZooKeeper]:
    state = tmp_path_factory.mktemp("secured-zk")
    pki = write_pki(state / "pki")
    client_port, peer, election, secure_port = tcp_ports.pick_free_ports(4)
    server = zkserver.Server(1, client_port, peer, election)
    security = zkserver.Secured(
        secure_port,
        keystore=pki / "server.pem",
        truststore=pki / "ca.pem",
        sasl_users={"nodes": NODES_PASSWORD, "ops": OPS_PASSWORD},
    )
    runtime = zkserver.find_runtime(netty=True)
    daemon = zkserver.start(runtime, state, server, [server], zkserver.DEFAULT_TICK_MS, security)
    try:
        zkserver.wait_ready(daemon, server, time.monotonic() + DEADLINE_S)
        yield SecuredZooKeeper(f"127.0.0.1:{client_port}", f"127.0.0.1:{secure_port}", pki)
    finally:
        processes.stop(daemon.pid, daemon.argv)


def tls_settings(pki: Path, ca: str = "ca.pem") -> dict[str, object]:
    return {
        "zookeeper.tls": True,
        "zookeeper.tls_ca_file": str(pki / ca),
        "zookeeper.tls_cert_file": str(pki / "client.pem"),
        "zookeeper.tls_key_file": str(pki / "client.key"),
    }


def operator_env(hosts: str, db_url: str, **settings: object) -> dict[str, str]:
    env = {env_name("zookeeper.hosts"): hosts, env_name("postgres.url"): db_url}
    env[env_name("zookeeper.connect_timeout_s")] = "3"
    for key, value in settings.items():
        env[env_name(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def status(env: dict[str, str]) -> tuple[int, str]:
    result = CliRunner().invoke(cli.main, ["status", "--json"], env=env)
    return result.exit_code, result.output


@pytest.fixture
def chroot(secured: SecuredZooKeeper) -> Iterator[str]:
    """A chroot of the test's own, made open by the cluster's identity (a node takes it
    over at its start, as on an ensemble a version without ACLs used)."""
    path = f"/t-{uuid.uuid4().hex[:12]}"
    root = zkclient.client_for(
        secured.plain,
        "",
        timeout_s=10.0,
        transport=Transport(sasl=Sasl("nodes", NODES_PASSWORD)),
    )
    root.start(timeout=DEADLINE_S)
    try:
        root.create(path, b"", acl=OPEN_ACL_UNSAFE)
        yield path
        root.delete(path, recursive=True)
    finally:
        root.stop()
        root.close()


def test_a_node_over_tls_and_sasl_and_an_operator_who_may_only_read(
    secured: SecuredZooKeeper,
    chroot: str,
    db_url: str,
    run_node: Callable[[Config], Node],
    tmp_path: Path,
) -> None:
    hosts = secured.tls + chroot
    node_settings: dict[str, object] = {
        "zookeeper.hosts": hosts,
        **tls_settings(secured.pki),
        "zookeeper.sasl_username": "nodes",
        "zookeeper.sasl_password": NODES_PASSWORD,
        "zookeeper.readers": READERS,
        "zookeeper.session_timeout_ms": 2000,
        "postgres.url": db_url,
        "node.name": "secured",
        "node.admin_address": "127.0.0.1:0",
        "pool.min_blocks": 8,
        "pool.low_watermark_blocks": 2,
    }
    node = run_node(load_config(None, node_settings, env={}))
    wait_for(lambda: node.role == "leader", "the node to lead over TLS with SASL")
    znode = node.snapshot()["znode"]
    assert znode is not None

    # Every znode: all rights for the nodes' SASL identity, read for the readers, no one else.
    expected = [
        make_acl("sasl", "nodes", all=True),
        make_acl("sasl", "ops", read=True),
        make_acl("digest", make_digest_acl_credential(*AUDIT), read=True),
    ]
    owner = zkclient.client(load_config(None, node_settings, env={}))
    owner.start(timeout=DEADLINE_S)
    try:
        for path in ("/", "/election", znode):
            assert zkclient.same_acl(owner.get_acls(path)[0], expected), path
    finally:
        owner.stop()
        owner.close()

    # The reader over TLS with SASL (its password from a file, as a systemd host has it).
    password_file = tmp_path / "ops-password"
    password_file.write_text(OPS_PASSWORD + "\n")
    reader = operator_env(hosts, db_url, **tls_settings(secured.pki))
    reader[env_name("zookeeper.sasl_username")] = "ops"
    reader[secret_file_env("zookeeper.sasl_password")] = str(password_file)
    code, output = status(reader)
    assert code == 0, output
    assert '"name": "secured"' in output

    watched = CliRunner().invoke(cli.main, ["watch", "--json", "--duration", "1s"], env=reader)
    assert watched.exit_code == 0, watched.output
    assert '"secured"' in watched.output

    # step-down is the admin token's to allow, which a read-only operator does not hold.
    stepped = CliRunner().invoke(cli.main, ["step-down"], env=reader)
    assert stepped.exit_code == 78, stepped.output
    assert stepped.output.startswith("error: node.admin_token is not set")
    assert node.role == "leader"

    # The digest reader over the plain port: reads too.
    digest_reader = {"zookeeper.auth": ":".join(AUDIT)}
    code, output = status(operator_env(secured.plain + chroot, db_url, **digest_reader))
    assert code == 0, output

    # A reader that tries to change anything is refused, in the operator commands' words.
    config = load_config(None, {}, env=reader)
    client = calls.zookeeper_client(config)
    calls.start(client, config)
    try:
        for write in (
            lambda: client.set("/election", b"99"),
            lambda: client.create(fence.generation_path("/election"), b"99"),
            lambda: client.delete(znode),
            lambda: client.create(f"/election/n-{uuid.uuid4().hex}-", b"", sequence=True),
        ):
            with (
                pytest.raises(ConfigError, match=REFUSED_READER) as caught,
                calls.zookeeper_errors(config, "rebase the fence"),
            ):
                write()
            assert caught.value.exit_code == 78
    finally:
        calls.close(client)

    # Anonymous (TLS, no identity): reads nothing.
    code, output = status(operator_env(hosts, db_url, **tls_settings(secured.pki)))
    assert code == 78, output
    assert "refused access" in output
    assert node.role == "leader"


# kazoo 2.11 leaves the socket of a refused handshake to the garbage collector
# (kazoo/handlers/utils.py, create_tcp_connection re-raises ssl.SSLError unclosed).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_server_our_ca_did_not_sign_is_refused_with_no_plaintext_fallback(
    secured: SecuredZooKeeper, db_url: str
) -> None:
    wrong_ca = operator_env(secured.tls, db_url, **tls_settings(secured.pki, "other-ca.pem"))
    wrong_ca[env_name("zookeeper.sasl_username")] = "ops"
    wrong_ca[env_name("zookeeper.sasl_password")] = OPS_PASSWORD
    wrong_ca[env_name("zookeeper.connect_timeout_s")] = "1"  # kazoo only times out; then we ask
    code, output = status(wrong_ca)
    assert code == 78, output
    assert f"TLS handshake with {secured.tls} failed: CERTIFICATE_VERIFY_FAILED" in output
    assert "check zookeeper.tls_ca_file" in output
    assert output.count("\n") == 1

    # TLS configured but the plain port named: refused, never spoken to in plain text.
    plain_port = {**wrong_ca, env_name("zookeeper.hosts"): secured.plain}
    plain_port[env_name("zookeeper.tls_ca_file")] = str(secured.pki / "ca.pem")
    code, output = status(plain_port)
    assert code == 78, output
    assert f"TLS handshake with {secured.plain} failed" in output


def test_a_wrong_sasl_password_is_refused(secured: SecuredZooKeeper, db_url: str) -> None:
    env = operator_env(secured.plain, db_url)
    env[env_name("zookeeper.sasl_username")] = "ops"
    env[env_name("zookeeper.sasl_password")] = "not-the-password"
    code, output = status(env)
    assert code == 78, output
    assert "check zookeeper.sasl_username and zookeeper.sasl_password" in output
    assert "not-the-password" not in output


def test_both_identities_while_a_cluster_moves_from_digest_to_sasl(
    secured: SecuredZooKeeper, chroot: str
) -> None:
    both = load_config(
        None,
        {
            "zookeeper.hosts": secured.plain + chroot,
            "zookeeper.auth": "nodes:digest-password",
            "zookeeper.sasl_username": "nodes",
            "zookeeper.sasl_password": NODES_PASSWORD,
        },
        env={},
    )
    owner = zkclient.client(both)
    owner.start(timeout=DEADLINE_S)
    try:
        owner.ensure_path("/election")
    finally:
        owner.stop()
        owner.close()
    digest_only = zkclient.client_for(
        secured.plain + chroot, "nodes:digest-password", timeout_s=10.0
    )
    sasl_only = zkclient.client_for(
        secured.plain + chroot,
        "",
        timeout_s=10.0,
        transport=Transport(sasl=Sasl("nodes", NODES_PASSWORD)),
    )
    for client in (digest_only, sasl_only):
        client.start(timeout=DEADLINE_S)
        try:
            client.set("/election", b"")  # either identity alone keeps every right
        finally:
            client.stop()
            client.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # kazoo, above
def test_a_node_whose_ca_did_not_sign_the_servers_stops_at_start_naming_the_key(
    secured: SecuredZooKeeper, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node, not only an operator command: exit 78 (a ConfigError) naming the CA key,
    instead of 75 "no ZooKeeper server answered", which a restart would never mend."""
    settings: dict[str, object] = {
        "zookeeper.hosts": secured.tls,
        **tls_settings(secured.pki, "other-ca.pem"),
        "zookeeper.sasl_username": "nodes",
        "zookeeper.sasl_password": NODES_PASSWORD,
        "zookeeper.connect_timeout_s": 1,
        "postgres.url": db_url,
        "node.name": "wrong-ca",
        "node.admin_address": "127.0.0.1:0",
    }
    # kazoo logs each refused handshake with its traceback, which holds the socket; pytest's
    # log capture would keep those records, and the sockets, past the test.
    monkeypatch.setattr(logging.getLogger("kazoo"), "level", logging.ERROR)
    node = build_node(load_config(None, settings, env={}))
    with pytest.raises(ConfigError, match=r"CERTIFICATE_VERIFY_FAILED.*zookeeper\.tls_ca_file"):
        node.run()
    gc.collect()  # kazoo's unclosed handshake sockets, while their warning is ignored

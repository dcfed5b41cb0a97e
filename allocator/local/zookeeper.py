"""ZooKeeper servers of the embedded cluster: Debian's ``zookeeper`` jars on the system Java.

One folder per server, ``<state>/zk/<id>/``: ``zoo.cfg`` (rewritten from the recorded ports
at every start), ``data/`` and ``zookeeper.log``; the pid is in ``cluster.json`` only.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from allocator.config import process_environment
from allocator.core.errors import PrerequisiteError, ServerStartError
from allocator.local import processes
from allocator.local.tcp_ports import LOOPBACK

log = logging.getLogger(__name__)

JAVA_DIR_ENV = "ALLOCATOR_ZK_JAVA_DIR"
DEFAULT_JAVA_DIR = Path("/usr/share/java")
DEFAULT_TICK_MS = 200
INIT_BUDGET_MS = 10_000
SYNC_BUDGET_MS = 2_000
MIN_SESSION_TICKS = 2
MAX_SESSION_TICKS = 100
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
REQUIRED_JARS = ("zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar")
LOGGER_JARS = ("slf4j-simple.jar", "slf4j-nop.jar")  # first one present wins
NETTY_JARS = (
    "netty-buffer.jar",
    "netty-codec.jar",
    "netty-common.jar",
    "netty-handler.jar",
    "netty-resolver.jar",
    "netty-transport.jar",
    "netty-transport-native-epoll.jar",
    "netty-transport-native-unix-common.jar",
)
"""Netty's connection factory, which TLS needs (:class:`Secured`); Debian ships them with
``zookeeper`` (libnetty-java)."""
NETTY_FACTORY = "org.apache.zookeeper.server.NettyServerCnxnFactory"
SASL_PROVIDER = "org.apache.zookeeper.server.auth.SASLAuthenticationProvider"
DIGEST_LOGIN_MODULE = "org.apache.zookeeper.server.auth.DigestLoginModule"
JVM_OPTIONS = (
    "-Xms16m",
    "-Xmx128m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",  # no /tmp/hsperfdata_* files outside the state folder
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.net.preferIPv4Stack=true",
    "-Dzookeeper.admin.enableServer=false",
    "-Dzookeeper.jmx.log4j.disable=true",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSSZ",
)
SERVING_MODES = ("leader", "follower", "standalone", "observer")
FOUR_LETTER_TIMEOUT_S = 0.5
READY_POLL_INTERVAL_S = 0.05


@dataclass(frozen=True)
class Server:
    """One ensemble member: its id (``myid``) and loopback ports."""

    id: int
    client_port: int
    peer_port: int
    election_port: int


@dataclass(frozen=True)
class Secured:
    """A server that also serves TLS on ``secure_port`` (127.0.0.1; Netty's factory) and
    accepts SASL DIGEST-MD5 for ``sasl_users`` (name: password), beside its plain client
    port (readiness and four-letter words stay there). For tests of a secured ensemble: the
    default embedded cluster has neither.

    ``keystore`` is a PEM file with the server's key and certificate, ``truststore`` a PEM
    CA that signed client certificates (mutual TLS is required of TLS clients)."""

    secure_port: int
    keystore: Path
    truststore: Path
    sasl_users: Mapping[str, str] = field(default_factory=dict, repr=False)

    def settings(self) -> dict[str, str]:
        """The server's extra ``zoo.cfg`` lines."""
        lines = {
            "secureClientPort": str(self.secure_port),
            "secureClientPortAddress": LOOPBACK,
            "serverCnxnFactory": NETTY_FACTORY,
            "ssl.keyStore.location": str(self.keystore),
            "ssl.keyStore.type": "PEM",
            "ssl.trustStore.location": str(self.truststore),
            "ssl.trustStore.type": "PEM",
            "ssl.clientAuth": "need",
        }
        if self.sasl_users:
            lines["authProvider.1"] = SASL_PROVIDER
        return lines

    def jaas(self) -> str:
        """The JAAS file of the SASL users (``Server`` section), empty without them."""
        if not self.sasl_users:
            return ""
        users = "\n".join(
            f'  user_{name}="{password}"' for name, password in self.sasl_users.items()
        )
        return f"Server {{\n  {DIGEST_LOGIN_MODULE} required\n{users};\n}};\n"


@dataclass(frozen=True)
class Runtime:
    """What it takes to launch a server: the Java binary and the classpath jars."""

    java: Path
    jars: tuple[Path, ...]
    jvm_options: tuple[str, ...] = ()


def java_dir(override: Path | None = None) -> Path:
    """The jar folder: ``override``, else ``$ALLOCATOR_ZK_JAVA_DIR``, else /usr/share/java."""
    if override is not None:
        return override
    env = process_environment().get(JAVA_DIR_ENV)
    return Path(env) if env else DEFAULT_JAVA_DIR


def find_runtime(
    jar_dir: Path | None = None, jvm_options: Sequence[str] = (), *, netty: bool = False
) -> Runtime:
    """Check the prerequisites and return the runtime, or raise :class:`PrerequisiteError`
    naming the apt-get fix; with ``netty`` (for :class:`Secured`) Netty's jars too.

    The classpath, verified by running it: the config folder, :data:`REQUIRED_JARS` and a
    logger (``slf4j-simple``: log lines to stderr, i.e. the log file; ``slf4j-nop`` if simple
    is missing, then the log only holds fatal JVM output). The default NIO connection factory
    needs nothing else, quorum included; Netty (``netty``) is for TLS, :class:`Secured`."""
    folder = java_dir(jar_dir)
    required = REQUIRED_JARS + (NETTY_JARS if netty else ())
    missing = [name for name in required if not (folder / name).is_file()]
    if missing:
        raise PrerequisiteError(
            f"ZooKeeper is not installed ({', '.join(missing)} not found in {folder}): "
            "apt-get install zookeeper (Debian package)"
        )
    jars = [folder / name for name in required]
    logger = next((folder / n for n in LOGGER_JARS if (folder / n).is_file()), None)
    if logger is not None:
        jars.append(logger)
    java = shutil.which("java")
    if java is None:
        raise PrerequisiteError("Java is not installed: apt-get install default-jre-headless")
    return Runtime(Path(java), tuple(jars), tuple(jvm_options))


def server_dir(state_dir: Path, server_id: int) -> Path:
    """``<state>/zk/<id>``."""
    return state_dir / "zk" / str(server_id)


def log_path(state_dir: Path, server_id: int) -> Path:
    """The server's log file."""
    return server_dir(state_dir, server_id) / "zookeeper.log"


def config_path(state_dir: Path, server_id: int) -> Path:
    """The server's ``zoo.cfg``."""
    return server_dir(state_dir, server_id) / "zoo.cfg"


def limits(tick_ms: int) -> dict[str, int]:
    """initLimit/syncLimit (ticks) and the session timeout bounds (ms) for ``tick_ms``.

    ``tickTime`` defaults to 200 ms (fast elections and expiry locally). initLimit/syncLimit
    derive from wall-clock budgets (10 s to connect and sync, 2 s of lag), so they stay sane
    whatever the tick. The session bounds are explicit, 2 to 100 ticks (400 ms to 20 s):
    ZooKeeper's default maximum, 20 ticks (4 s at 200 ms), would silently clamp the 10 s a
    node asks for."""
    if tick_ms < 1:
        raise ValueError(f"tickTime must be >= 1 ms, not {tick_ms}")
    return {
        "initLimit": max(5, math.ceil(INIT_BUDGET_MS / tick_ms)),
        "syncLimit": max(2, math.ceil(SYNC_BUDGET_MS / tick_ms)),
        "minSessionTimeout": MIN_SESSION_TICKS * tick_ms,
        "maxSessionTimeout": MAX_SESSION_TICKS * tick_ms,
    }


def render_config(
    state_dir: Path,
    me: Server,
    ensemble: Sequence[Server],
    tick_ms: int,
    settings: Mapping[str, str] | None = None,
) -> str:
    """The text of ``zoo.cfg`` for server ``me`` of ``ensemble``.

    Loopback only: ``clientPortAddress`` and ``server.N=127.0.0.1:…`` (a quorum peer binds the
    address it is given; ``quorumListenOnAllIPs`` stays false). The admin HTTP server is off
    (Debian lacks its servlet jars too); every four-letter word is allowed (readiness uses
    ``srvr``; operators and tests ``mntr``, ``wchc``, ``ruok``). ``reconfigEnabled=false``;
    one server is standalone, more a static ensemble (``standaloneEnabled=false``).
    ``settings`` are extra lines (:meth:`Secured.settings`)."""
    lines = [
        "# Generated by `allocator local`; rewritten at every start. Loopback only.",
        f"tickTime={tick_ms}",
        *(f"{key}={value}" for key, value in limits(tick_ms).items()),
        f"dataDir={server_dir(state_dir, me.id) / 'data'}",
        f"clientPort={me.client_port}",
        f"clientPortAddress={LOOPBACK}",
        "admin.enableServer=false",
        "4lw.commands.whitelist=*",
        "autopurge.snapRetainCount=3",
        "autopurge.purgeInterval=1",
        "reconfigEnabled=false",
    ]
    if len(ensemble) > 1:
        lines.append("standaloneEnabled=false")
        lines.extend(f"server.{s.id}={LOOPBACK}:{s.peer_port}:{s.election_port}" for s in ensemble)
    lines.extend(f"{key}={value}" for key, value in (settings or {}).items())
    return "\n".join(lines) + "\n"


def write_config(
    state_dir: Path,
    me: Server,
    ensemble: Sequence[Server],
    tick_ms: int,
    settings: Mapping[str, str] | None = None,
) -> Path:
    """Create the server folder, ``data/myid`` and ``zoo.cfg``; return the config path."""
    data = server_dir(state_dir, me.id) / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "myid").write_text(f"{me.id}\n")
    path = config_path(state_dir, me.id)
    tmp = path.with_name("zoo.cfg.tmp")
    tmp.write_text(render_config(state_dir, me, ensemble, tick_ms, settings))
    tmp.replace(path)
    return path


def command(runtime: Runtime, cfg: Path) -> list[str]:
    """The java command line that runs the server configured by ``cfg``."""
    classpath = os.pathsep.join([str(cfg.parent), *(str(jar) for jar in runtime.jars)])
    return [
        str(runtime.java),
        *JVM_OPTIONS,
        *runtime.jvm_options,
        "-cp",
        classpath,
        MAIN_CLASS,
        str(cfg),
    ]


def start(
    runtime: Runtime,
    state_dir: Path,
    me: Server,
    ensemble: Sequence[Server],
    tick_ms: int,
    secured: Secured | None = None,
) -> processes.Daemon:
    """Write the config and start server ``me`` as a daemon (not waiting for it); with
    ``secured`` also its TLS port and SASL users (``runtime`` from
    ``find_runtime(netty=True)``; the JAAS file is written mode 0600 beside ``zoo.cfg``)."""
    settings = secured.settings() if secured is not None else None
    cfg = write_config(state_dir, me, ensemble, tick_ms, settings)
    if secured is not None and secured.sasl_users:
        jaas = cfg.with_name("jaas.conf")
        jaas.touch(mode=0o600)
        jaas.chmod(0o600)  # a file left by an earlier start keeps its mode otherwise
        jaas.write_text(secured.jaas())
        runtime = Runtime(
            runtime.java,
            runtime.jars,
            (*runtime.jvm_options, f"-Djava.security.auth.login.config={jaas}"),
        )
    environ = process_environment()
    env: dict[str, str] = {
        key: environ[key] for key in ("PATH", "JAVA_HOME", "LANG") if key in environ
    }
    return processes.start(
        command(runtime, cfg),
        log_path=log_path(state_dir, me.id),
        env=env,
        cwd=server_dir(state_dir, me.id),
    )


def four_letter_word(port: int, word: str, timeout_s: float = FOUR_LETTER_TIMEOUT_S) -> str:
    """Send a four-letter command to ``127.0.0.1:port`` and return the whole reply."""
    chunks: list[bytes] = []
    with socket.create_connection((LOOPBACK, port), timeout=timeout_s) as sock:
        sock.sendall(word.encode("ascii"))
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def mode(port: int, timeout_s: float = FOUR_LETTER_TIMEOUT_S) -> str | None:
    """The server's ``Mode:`` from ``srvr`` (leader, follower, standalone), None if it has none."""
    try:
        reply = four_letter_word(port, "srvr", timeout_s)
    except OSError:
        return None
    for line in reply.splitlines():
        if line.startswith("Mode:"):
            return line.partition(":")[2].strip()
    return None


def is_ok(port: int, timeout_s: float = FOUR_LETTER_TIMEOUT_S) -> bool:
    """True if the server answers ``ruok`` with ``imok`` (running, maybe without quorum)."""
    try:
        return four_letter_word(port, "ruok", timeout_s).strip() == "imok"
    except OSError:
        return False


def wait_ready(
    daemon: processes.Daemon, server: Server, deadline: float, *, need_quorum: bool = True
) -> str | None:
    """Wait until the server serves (a mode: leader, follower, standalone; a server without
    quorum answers but has none), or only answers ``ruok`` if not ``need_quorum``.

    Returns the mode (None when quorum was not required and is not there). Raises
    :class:`ServerStartError` with the log tail if the process exits or the deadline passes.
    """
    while True:
        if not processes.is_alive(daemon.pid, daemon.argv):
            raise ServerStartError(
                f"ZooKeeper server {server.id} (pid {daemon.pid}) exited during start; "
                f"last lines of {daemon.log_path}:\n"
                + processes.tail(daemon.log_path, offset=daemon.log_offset)
            )
        current = mode(server.client_port)
        if current in SERVING_MODES:
            return current
        if not need_quorum and is_ok(server.client_port):
            return None
        if time.monotonic() >= deadline:
            raise ServerStartError(
                f"ZooKeeper server {server.id} (pid {daemon.pid}, client port "
                f"{server.client_port}) was not serving by its deadline; last lines of "
                f"{daemon.log_path}:\n" + processes.tail(daemon.log_path, offset=daemon.log_offset)
            )
        time.sleep(READY_POLL_INTERVAL_S)


def check_client(hosts: str, timeout_s: float) -> None:
    """Connect a kazoo client to ``hosts`` and ``sync`` through the leader (needs quorum)."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError

    client = KazooClient(hosts=hosts, timeout=max(1.0, timeout_s))
    try:
        client.start(timeout=max(1.0, timeout_s))
        client.sync("/")
    except (KazooException, KazooTimeoutError) as exc:
        raise ServerStartError(f"a ZooKeeper client could not connect to {hosts}") from exc
    finally:
        client.stop()
        client.close()


def ensure_chroot(hosts: str, chroot: str, auth: str, timeout_s: float) -> None:
    """Create the cluster's ``chroot`` on ``hosts`` (the ensemble, no chroot) if it does not
    exist: its parents with the open ACL, itself with all rights for the digest identity
    ``auth`` alone (:mod:`allocator.zookeeper.client`). An existing chroot with another ACL (made
    by a version without ACLs) gets ours. An empty ``auth`` leaves the chroot open."""
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError

    from allocator.zookeeper import client as zkclient

    acl = zkclient.digest_acl(auth)
    client = zkclient.client_for(hosts, auth, timeout_s=max(1.0, timeout_s))

    def wait(pending: Any) -> Any:
        return pending.get(timeout=max(1.0, timeout_s))

    try:
        client.start(timeout=max(1.0, timeout_s))
        if not zkclient.ensure_chroot(client, chroot, acl, wait) and acl is not None:
            zkclient.take_over(client, chroot, acl, wait)
    except (KazooException, KazooTimeoutError) as exc:
        raise ServerStartError(f"could not create the znode {chroot} on {hosts}") from exc
    finally:
        client.stop()
        client.close()

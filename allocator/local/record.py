"""The record of one embedded cluster, ``cluster.json``: what was started and what is wanted.

Its types, their JSON, and the first record of a new cluster; :mod:`.folder` reads and
writes the file.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from allocator.core.errors import LocalClusterError, UsageError
from allocator.local import nodes as nodes_mod
from allocator.local import postgres, processes, tcp_ports, zookeeper
from allocator.local.tcp_ports import LOOPBACK

STATE_VERSION = 1
DEFAULT_ZK_SERVERS = 3

PRIMARY = "primary"
STANDBY = "standby"
RETIRED = "retired"
"""A primary that a failover left behind: never started again (it would be a second
primary on an old timeline); ``down --purge`` removes it."""


@dataclass
class Proc:
    """A recorded process: it counts as running only while its pid still runs its argv."""

    pid: int | None = None
    argv: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        """True while the recorded pid still runs the recorded argv."""
        return processes.is_alive(self.pid, self.argv)

    def forget_if_gone(self) -> None:
        """Clear the recorded pid once its process is confirmed gone (never before)."""
        if not self.alive():
            self.pid = None


@dataclass
class ZkRecord:
    """One ZooKeeper server as recorded: its ports and its process."""

    server: zookeeper.Server
    proc: Proc


@dataclass
class PgRecord:
    """A PostgreSQL server and its role: ``primary`` (exactly one), ``standby`` (made by
    ``pg_standby``) or ``retired`` (:data:`RETIRED`)."""

    port: int
    data_dir: str
    proc: Proc
    server: str = postgres.FIRST_SERVER
    role: str = PRIMARY

    def to_json(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "data_dir": self.data_dir,
            "pid": self.proc.pid,
            "argv": self.proc.argv,
            "server": self.server,
            "role": self.role,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any], server: str) -> PgRecord:
        role = str(raw.get("role", PRIMARY))
        if role not in (PRIMARY, STANDBY, RETIRED):
            raise ValueError(f"unknown PostgreSQL role {role!r}")
        return cls(
            int(raw["port"]),
            str(raw["data_dir"]),
            Proc(raw["pid"], [str(a) for a in raw["argv"]]),
            server=str(raw.get("server", server)),
            role=role,
        )


@dataclass
class State:
    """The one source of truth for what was started and what is wanted.

    Ports, tick, OS user, for every server and for the node supervisor its pid and argv
    (:class:`Proc`), and for every node its spec and desired state
    (:mod:`allocator.local.nodes`). What the nodes do is in ``nodes/nodes.json``, written by
    the supervisor only.
    """

    tick_ms: int
    superuser: str
    os_user: str
    zk: list[ZkRecord]
    postgres: PgRecord
    created_at: str
    admin_token: str
    nodes: list[nodes_mod.NodeSpec] = field(default_factory=list)
    zk_auth: str = ""
    """The cluster's ZooKeeper digest identity ``user:password`` (``zookeeper.auth``)."""
    node_generation: int = 0
    supervisor: Proc = field(default_factory=Proc)
    # Node settings as asked for; None: the default (resolved when the specs are built).
    node_command: list[str] | None = None
    node_env: dict[str, str] = field(default_factory=dict)
    session_timeout_ms: int | None = None
    standby: PgRecord | None = None

    def pg_servers(self) -> list[PgRecord]:
        """The PostgreSQL servers: the first one, then the standby if there is one."""
        return [self.postgres] + ([self.standby] if self.standby is not None else [])

    def primary(self) -> PgRecord:
        """The server that takes writes (the standby once a failover promoted it)."""
        for record in self.pg_servers():
            if record.role == PRIMARY:
                return record
        raise LocalClusterError("the cluster record names no PostgreSQL primary")

    def live_standby(self) -> PgRecord | None:
        """The server in the standby role, if any (none after a failover, until rebuilt)."""
        return next((r for r in self.pg_servers() if r.role == STANDBY), None)

    def pg_ports(self) -> list[int]:
        """Every server's port, in a fixed order: clients' multi-host URLs list them all.

        So a URL handed out never changes across a failover.
        """
        return [record.port for record in self.pg_servers()]

    def zk_hosts(self) -> str:
        """``127.0.0.1:<client port>,…`` of every ZooKeeper server (no chroot)."""
        return ",".join(f"{LOOPBACK}:{r.server.client_port}" for r in self.zk)

    def ports_in_use(self) -> set[int]:
        """Every recorded port: PostgreSQL's, ZooKeeper's (all three), the nodes' admin ports."""
        taken = set(self.pg_ports()) | {spec.admin_port for spec in self.nodes}
        for record in self.zk:
            server = record.server
            taken |= {server.client_port, server.peer_port, server.election_port}
        return taken

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "created_at": self.created_at,
            "tick_ms": self.tick_ms,
            "superuser": self.superuser,
            "os_user": self.os_user,
            "zk": [
                {
                    "id": r.server.id,
                    "client_port": r.server.client_port,
                    "peer_port": r.server.peer_port,
                    "election_port": r.server.election_port,
                    "pid": r.proc.pid,
                    "argv": r.proc.argv,
                }
                for r in self.zk
            ],
            "postgres": self.postgres.to_json(),
            "pg_standby": self.standby.to_json() if self.standby is not None else None,
            "admin_token": self.admin_token,
            "zk_auth": self.zk_auth,
            "node_command": self.node_command,
            "node_env": self.node_env,
            "session_timeout_ms": self.session_timeout_ms,
            "supervisor": {"pid": self.supervisor.pid, "argv": self.supervisor.argv},
            "node_generation": self.node_generation,
            "nodes": [spec.to_json() for spec in self.nodes],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> State:
        if raw.get("version") != STATE_VERSION:
            raise ValueError(f"unknown record version {raw.get('version')!r}")
        pg = raw["postgres"]
        supervisor = raw.get("supervisor") or {}
        command = raw.get("node_command")
        timeout = raw.get("session_timeout_ms")
        return cls(
            tick_ms=int(raw["tick_ms"]),
            superuser=str(raw["superuser"]),
            os_user=str(raw["os_user"]),
            zk=[
                ZkRecord(
                    zookeeper.Server(
                        int(z["id"]),
                        int(z["client_port"]),
                        int(z["peer_port"]),
                        int(z["election_port"]),
                    ),
                    Proc(z["pid"], [str(a) for a in z["argv"]]),
                )
                for z in raw["zk"]
            ],
            postgres=PgRecord.from_json(pg, postgres.FIRST_SERVER),
            standby=(
                PgRecord.from_json(raw["pg_standby"], postgres.STANDBY_SERVER)
                if raw.get("pg_standby")
                else None
            ),
            created_at=str(raw.get("created_at", "")),
            # Records from before the nodes had none; one is made up when nodes first start.
            admin_token=str(raw.get("admin_token", "")),
            # Records from before ZooKeeper ACLs had none; one is made up at the next `up`.
            zk_auth=str(raw.get("zk_auth", "")),
            nodes=[nodes_mod.NodeSpec.from_json(n) for n in raw.get("nodes", [])],
            node_generation=int(raw.get("node_generation", 0)),
            supervisor=Proc(supervisor.get("pid"), [str(a) for a in supervisor.get("argv", [])]),
            node_command=[str(a) for a in command] if command is not None else None,
            node_env={str(k): str(v) for k, v in dict(raw.get("node_env") or {}).items()},
            session_timeout_ms=int(timeout) if timeout is not None else None,
        )


def new_state(
    state_dir: Path,
    *,
    zk_servers: int | None,
    tick_ms: int | None,
    zk_client_ports: Sequence[int] | None,
    pg_port: int | None,
) -> State:
    """The first record of a cluster in ``state_dir``; nothing is started.

    ``zk_servers`` ZooKeeper servers (None: 3) and a PostgreSQL primary, each on a port
    picked free now, unless ``zk_client_ports``/``pg_port`` request one (checked free, and
    raising :class:`~allocator.core.errors.PortInUseError` naming it if not); new secrets.
    """
    count = zk_servers or DEFAULT_ZK_SERVERS
    requested: list[tuple[int, str]] = []
    if zk_client_ports is not None:
        requested += [
            (p, f"ZooKeeper server {i} client port") for i, p in enumerate(zk_client_ports, 1)
        ]
    if pg_port is not None:
        requested.append((pg_port, "PostgreSQL port"))
    numbers = [p for p, _ in requested]
    if len(set(numbers)) != len(numbers):
        raise UsageError(f"the requested ports are not distinct: {numbers}")
    for port, what in requested:
        tcp_ports.ensure_free(port, what)
    free = iter(
        tcp_ports.pick_free_ports_except(3 * count + 1 - len(requested), exclude=set(numbers))
    )
    client_ports = zk_client_ports or tuple(next(free) for _ in range(count))
    servers = [
        zookeeper.Server(i, client_ports[i - 1], next(free), next(free))
        for i in range(1, count + 1)
    ]
    port = pg_port if pg_port is not None else next(free)
    user = postgres.server_user()
    return State(
        tick_ms=tick_ms or zookeeper.DEFAULT_TICK_MS,
        superuser=user.name,
        os_user=user.name,
        zk=[ZkRecord(s, Proc()) for s in servers],
        postgres=PgRecord(port, str(postgres.pg_dir(state_dir) / "data"), Proc()),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        admin_token=new_token(),
        zk_auth=new_zk_auth(),
    )


def new_token() -> str:
    """A random admin token for the nodes' admin actions (kept in the record, mode 0600)."""
    return secrets.token_urlsafe(24)


def new_zk_auth() -> str:
    """A random digest identity ``allocator-<hex>:<password>`` for one cluster.

    ZooKeeper ACLs by default: a new cluster gets one, recorded in ``cluster.json`` (like the
    admin token; the record is written mode 0600) and given to the nodes as
    ``ALLOCATOR_ZOOKEEPER_AUTH`` in their environment, never on a command line.
    """
    return f"allocator-{secrets.token_hex(4)}:{secrets.token_urlsafe(24)}"

"""ZooKeeper access: how every kazoo client of the project is built, and the ACL of every
znode the cluster creates.

One identity per cluster with every right: ``zookeeper.auth`` (digest ``user:password``,
from the environment or the config file, never a flag) and/or ``zookeeper.sasl_username``
(SASL DIGEST-MD5); kazoo re-sends it on every reconnect. ``zookeeper.readers`` may read.
TLS and SASL options: :mod:`allocator.zookeeper.security`. Operators' side:
``docs/zookeeper-acls.md``; design: docs/design.md §11.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoAuthError, NodeExistsError, NoNodeError
from kazoo.retry import KazooRetry
from kazoo.security import (
    ACL,
    OPEN_ACL_UNSAFE,
    READ_ACL_UNSAFE,
    Id,
    Permissions,
    make_acl,
    make_digest_acl,
)

from allocator import fence
from allocator.config import Config
from allocator.core import logs
from allocator.core.errors import ConfigError
from allocator.core.zookeeper_hosts import chroot_of, servers_of
from allocator.zookeeper.negotiated import track_granted_timeout
from allocator.zookeeper.security import Transport, transport

log = logs.get_logger(__name__)

INSECURE_WARNING = (
    "zookeeper.insecure is set and zookeeper.auth is empty: this node runs without ZooKeeper "
    "ACLs; anyone who reaches ZooKeeper can stall the election or redirect step-down"
)
INSECURE_CHECK_WARNING = (
    "zookeeper.insecure is set: a node would run without ZooKeeper ACLs; anyone who reaches "
    "ZooKeeper could stall the election or redirect step-down"
)
NO_AUTH_ERROR = (
    "zookeeper.auth is not set: a node refuses to run without ZooKeeper ACLs; set "
    "ALLOCATOR_ZOOKEEPER_AUTH (user:password) or [zookeeper] auth in the config file (or a "
    "SASL identity: zookeeper.sasl_username and sasl_password), or zookeeper.insecure = true "
    "to run without them"
)
NO_AUTH_WARNING = (
    "zookeeper.auth is not set: `allocator run` refuses to start with this configuration "
    "(set zookeeper.auth, or zookeeper.insecure = true to run without ZooKeeper ACLs)"
)
SECURE_ATTEMPTS = 3

Wait = Callable[[Any], Any]
"""Waits for a kazoo async result within the caller's bound and returns its value."""


def credentials(config: Config) -> tuple[str, str] | None:
    """The cluster's identity as (user, password): ``zookeeper.auth``'s digest one, else the
    SASL one (``zookeeper.sasl_username``); None with neither (no ACLs)."""
    user, _, password = config.zookeeper.auth.get_secret_value().partition(":")
    if user:
        return user, password
    zk = config.zookeeper
    return (zk.sasl_username, zk.sasl_password.get_secret_value()) if zk.sasl_username else None


def acl(config: Config) -> list[ACL] | None:
    """The ACL of every znode the cluster creates; None (ZooKeeper's open ACL) without an
    identity.

    The cluster's identities (the digest one of ``zookeeper.auth``, ``sasl:<username>`` of
    ``zookeeper.sasl_username``) have every right; ``zookeeper.readers`` read only; nobody
    else any, except read for the world with ``zookeeper.world_readable``.
    """
    zk = config.zookeeper
    ours = digest_acl(zk.auth.get_secret_value()) or []
    if zk.sasl_username:
        ours.append(make_acl("sasl", zk.sasl_username, all=True))
    if not ours:
        return None
    readers = [ACL(Permissions.READ, Id(scheme, ident)) for scheme, ident in zk.reader_ids()]
    return ours + readers + (list(READ_ACL_UNSAFE) if zk.world_readable else [])


def digest_acl(auth: str, world_readable: bool = False) -> list[ACL] | None:
    """All rights for the digest identity ``user:password`` (read for anyone too with
    ``world_readable``); None for an empty ``auth``."""
    user, _, password = auth.partition(":")
    if not user:
        return None
    ours = [make_digest_acl(user, password, all=True)]
    return ours + list(READ_ACL_UNSAFE) if world_readable else ours


def client(
    config: Config,
    *,
    chroot: bool = True,
    logger: logging.Logger | None = None,
    connection_retry: KazooRetry | None = None,
    command_retry: KazooRetry | None = None,
) -> KazooClient:
    """A kazoo client (not started) for the config's ensemble, authenticated with
    ``zookeeper.auth``.

    Every client of the project (a node's, ``status``/``watch``/``step-down``'s, the
    operator commands', the embedded cluster's tools) is built here. Inside the chroot it
    has the cluster's ACL as ``default_acl`` (everything it can create lies at or below the
    chroot). With ``chroot=False`` (to create the chroot after an ensemble was wiped) it has
    none: :func:`ensure_chroot` gives the chroot's parents, which other clusters may share,
    the open ACL and only the chroot ours.
    """
    zk = config.zookeeper
    return client_for(
        zk.hosts if chroot else servers_of(zk.hosts),
        zk.auth.get_secret_value(),
        timeout_s=zk.session_timeout_ms / 1000,
        default_acl=acl(config) if chroot else None,
        logger=logger,
        connection_retry=connection_retry,
        command_retry=command_retry,
        transport=transport(config),
    )


def client_for(
    hosts: str,
    auth: str,
    *,
    timeout_s: float,
    default_acl: Sequence[ACL] | None = None,
    logger: logging.Logger | None = None,
    connection_retry: KazooRetry | None = None,
    command_retry: KazooRetry | None = None,
    transport: Transport | None = None,
) -> KazooClient:
    """A kazoo client (not started) of ``hosts`` authenticated as ``auth`` (``user:password``
    or empty), for tools that have no :class:`Config` (the embedded cluster's own), over
    ``transport``'s TLS and SASL (none by default)."""
    options: dict[str, Any] = transport.kazoo_options() if transport is not None else {}
    if logger is not None:
        options["logger"] = logger
    if connection_retry is not None:
        options["connection_retry"] = connection_retry
    if command_retry is not None:
        options["command_retry"] = command_retry
    built = KazooClient(
        hosts=hosts,
        timeout=timeout_s,
        auth_data=[("digest", auth)] if auth else None,
        default_acl=list(default_acl) if default_acl else None,
        **options,
    )
    return track_granted_timeout(built)


def check_node(config: Config) -> None:
    """Refuse a node without an identity (``zookeeper.auth`` or ``zookeeper.sasl_username``)
    unless ``zookeeper.insecure`` is set, and one whose TLS files cannot be used.

    An insecure node warns at every start and ``config check`` says so (:func:`warnings`).
    """
    if credentials(config) is None and not config.zookeeper.insecure:
        raise ConfigError(NO_AUTH_ERROR)
    transport(config)  # its TLS files, read now rather than retried by kazoo forever


def warnings(config: Config) -> list[str]:
    """What ``config check`` says about ZooKeeper access, one line each."""
    if credentials(config) is not None:
        return []
    if config.zookeeper.insecure:
        return [INSECURE_CHECK_WARNING]
    return [NO_AUTH_WARNING]


def access_refused(config: Config, what: str) -> ConfigError:
    """The one-line error for a ``NoAuth`` answer while doing ``what``."""
    return ConfigError(f"{what}: {refusal(config)}")


def refusal(config: Config) -> str:
    """Why ZooKeeper refused a request (``NoAuth``), naming the identity's keys."""
    zk = config.zookeeper
    if zk.auth.get_secret_value():
        who = "the digest identity of zookeeper.auth"
    elif zk.sasl_username:
        who = f"sasl:{zk.sasl_username} (zookeeper.sasl_username)"
    else:
        who = "unauthenticated"
    return (
        f"ZooKeeper at {zk.hosts} refused access; check zookeeper.auth / "
        f"zookeeper.sasl_username (this client: {who}; nodes, and operators who change "
        "anything, need the cluster's identity; one of zookeeper.readers may only read)"
    )


def owned_paths(config: Config) -> list[str]:
    """Persistent znodes the cluster creates, as a chrooted client addresses them: the
    chroot itself (``/``, only when there is a chroot), the election path with its parents,
    and the fence's znodes beside it."""
    election = config.zookeeper.election_path.rstrip("/")
    parts = election.strip("/").split("/")
    paths = ["/"] if chroot_of(config.zookeeper.hosts) else []
    paths += ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
    paths += [fence.generation_path(election), fence.watermark_path(election)]
    return paths


def secure(zk: Any, config: Config, wait: Wait, paths: Iterable[str] | None = None) -> list[str]:
    """Give our ACL to each existing znode of ``paths`` (default :func:`owned_paths`) that
    carries another one; returns those changed.

    Takes over what a version without ACLs left open, when a node starts: the chroot, the
    election path and its parents below the chroot, the fence's znodes. That needs ADMIN,
    which an open ACL grants anybody; a znode whose ACL grants our identity nothing, and
    every ``NoAuth`` answer, is a :class:`ConfigError` naming ``zookeeper.auth`` (digest
    authentication itself never fails: a wrong password is only another identity). Ephemeral
    election znodes are left alone: they go with their sessions. A no-op without auth;
    ``zk`` is a started client inside the chroot.
    """
    wanted = acl(config)
    if wanted is None:
        return []
    changed: list[str] = []
    for path in owned_paths(config) if paths is None else paths:
        try:
            if take_over(zk, path, wanted, wait):
                changed.append(path)
        except NoAuthError as exc:
            raise access_refused(config, f"take over the ACL of {path}") from exc
    return changed


def take_over(zk: Any, path: str, wanted: Sequence[ACL], wait: Wait) -> bool:
    """Set ``wanted`` on ``path`` unless it has it; True if set here. A concurrent change
    of the ACL (another node starting) makes it read again."""
    for _ in range(SECURE_ATTEMPTS):
        try:
            current, stat = wait(zk.get_acls_async(path))
            if same_acl(current, wanted):
                return False
            wait(zk.set_acls_async(path, list(wanted), version=stat.aversion))
        except NoNodeError:
            return False
        except BadVersionError:
            continue
        log.warning(
            "zookeeper_acl_set",
            path=path,
            note="it carried another ACL (made by a version without ZooKeeper ACLs, or "
            "before zookeeper.readers or the identity changed); now it carries the cluster's",
        )
        return True
    return False  # others keep changing it: the next start looks again


def same_acl(current: Sequence[ACL], wanted: Sequence[ACL]) -> bool:
    """True if both grant the same rights to the same identities, in any order."""
    return {(a.perms, a.id.scheme, a.id.id) for a in current} == {
        (a.perms, a.id.scheme, a.id.id) for a in wanted
    }


def ensure_chroot(root: Any, chroot: str, wanted: Sequence[ACL] | None, wait: Wait) -> bool:
    """Create ``chroot`` with ``wanted`` (its parents with the open ACL) through ``root``, a
    started client without the chroot; True if it was created here. An existing chroot is
    left as it is (:func:`secure` takes it over from inside)."""
    if not chroot or chroot == "/":
        return False
    parent = posixpath.dirname(chroot)
    if parent != "/":
        wait(root.ensure_path_async(parent, acl=OPEN_ACL_UNSAFE))
    try:
        wait(root.create_async(chroot, b"", acl=list(wanted) if wanted else OPEN_ACL_UNSAFE))
    except NodeExistsError:
        return False
    return True

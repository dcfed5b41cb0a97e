"""An operator's ZooKeeper calls (``status``, ``watch``, ``fence``, ``pool``): a client of the
cluster's identity, a bounded wait for every call, kazoo's errors as the project's own."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.interfaces import IAsyncResult

from allocator.config import Config
from allocator.core.errors import AllocatorError, ConfigError, ZooKeeperUnavailableError
from allocator.core.exits import Exit
from allocator.zookeeper import client as zkclient
from allocator.zookeeper import security

KAZOO_LOG = logging.getLogger(__name__ + ".kazoo")
"""kazoo's own log for the operator's client. Its retry chatter (one WARNING per refused
connection) would bury the command's one error line, which says the same; ERROR and
above still show."""
KAZOO_LOG.setLevel(logging.ERROR)


def zookeeper_client(config: Config, *, chroot: bool = True) -> KazooClient:
    """An operator's kazoo client (not started): the config's hosts, with or without their
    chroot, authenticated like a node (:func:`allocator.zookeeper.client.client`)."""
    return zkclient.client(config, chroot=chroot, logger=KAZOO_LOG)


def start(client: KazooClient, config: Config) -> None:
    """Connect, or raise :func:`allocator.zookeeper.security.unanswered`'s error. A missing
    chroot is no error here (the caller reports an empty election), so kazoo's warning about
    it is silenced."""
    zk = config.zookeeper
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No chroot path exists")
        try:
            client.start(timeout=zk.connect_timeout_s)
        except KazooTimeoutError as exc:
            raise security.unanswered(config, zk.connect_timeout_s) from exc


def close(client: KazooClient) -> None:
    """Stop and close ``client``, ignoring a connection already gone."""
    client.stop()
    client.close()


@contextmanager
def zookeeper_errors(config: Config, what: str) -> Iterator[None]:
    """Translates kazoo's errors raised while doing ``what`` into the project's."""
    hosts = config.zookeeper.hosts
    try:
        yield
    except NoAuthError as exc:
        raise zkclient.access_refused(config, what) from exc
    except AuthFailedError as exc:
        raise ConfigError(
            f"{what}: ZooKeeper at {hosts} refused access: authentication failed; check "
            "zookeeper.sasl_username and zookeeper.sasl_password"
        ) from exc
    except (ConnectionLoss, SessionExpiredError, KazooTimeoutError) as exc:
        raise ZooKeeperUnavailableError(
            f"{what}: lost the connection to ZooKeeper at {hosts}"
        ) from exc
    except KazooException as exc:
        raise AllocatorError(f"{what}: ZooKeeper at {hosts} refused the request") from exc


def wait(pending: IAsyncResult, config: Config) -> Any:
    """A kazoo async call's result within the connect timeout (kazoo queues calls while
    disconnected; a plain call would wait for the reconnect, however long)."""
    return pending.get(timeout=config.zookeeper.connect_timeout_s)


class ZooKeeperCallTimeoutError(AllocatorError):
    """A ZooKeeper call got no answer within its bound (the connection is probably down)."""

    exit_code = Exit.TEMPFAIL


def bounded(pending: IAsyncResult, timeout_s: float) -> Any:
    """The result of a kazoo async call, waiting at most ``timeout_s``: kazoo queues calls
    while disconnected, and a plain call would wait for the reconnect, however long, deaf
    to the node's own session timer and to SIGTERM."""
    try:
        return pending.get(timeout=timeout_s)
    except KazooTimeoutError as exc:
        raise ZooKeeperCallTimeoutError(f"ZooKeeper did not answer within {timeout_s} s") from exc

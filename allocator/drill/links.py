"""Each drilled node's links to ZooKeeper and PostgreSQL, and its clock: what the drill can break.

The drill tells each node through one file, ``<links_dir>/<name>.json``, that the node command
(:mod:`allocator.drill.shim`) reads when the node starts; everything is loopback.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from allocator.core import files
from allocator.core.errors import ConfigError, UsageError
from allocator.drill.proxy import Proxy

FILE_SUFFIX = ".json"
FILE_MODE = 0o600
DIR_MODE = 0o700
OFFSET_UNITS = "smhdy"
_OFFSET = re.compile(rf"[+-][0-9]+[{OFFSET_UNITS}]")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_MAX_PORT = 65535


class LinksFileError(ConfigError):
    """A node's links file cannot be used; the message names the file and the problem."""


def validate_offset(offset: str | None) -> str | None:
    """``offset`` if it is a clock offset libfaketime reads or None, else
    :class:`~allocator.core.errors.UsageError`: a sign, an integer and a unit (``s``, ``m``,
    ``h``, ``d``, ``y``), as in ``+1h``, ``-1m``, ``+60y``."""
    if offset is None or _OFFSET.fullmatch(offset):
        return offset
    raise UsageError(
        f"clock offset {offset!r}: expected a sign, an integer and a unit "
        f"({', '.join(OFFSET_UNITS)}), e.g. +1h or -1m"
    )


def validate_name(name: str) -> str:
    """``name`` if it can name a links file (no path separator, no leading dot)."""
    if not _NAME.fullmatch(name):
        raise UsageError(f"node name {name!r} cannot name a links file")
    return name


def links_path(links_dir: Path, name: str) -> Path:
    """The links file of node ``name``."""
    return links_dir / f"{validate_name(name)}{FILE_SUFFIX}"


@dataclass(frozen=True)
class NodeLinks:
    """What one links file says: upstream port -> proxy port, and the clock offset.

    On disk: ``{"ports": {"<upstream port>": <proxy port>, ...}, "faketime": null | "<offset>"}``.
    """

    ports: Mapping[int, int]
    faketime: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object."""
        return {
            "ports": {str(upstream): proxy for upstream, proxy in sorted(self.ports.items())},
            "faketime": self.faketime,
        }


def _port(value: object) -> int | None:
    if isinstance(value, str) and value.isascii() and value.isdecimal():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= _MAX_PORT:
        return value
    return None


def parse_node_links(data: object) -> NodeLinks:
    """A links file's decoded JSON as :class:`NodeLinks`; ``ValueError`` names what is wrong
    (an offset :func:`validate_offset` would refuse included)."""
    if not isinstance(data, dict) or set(data) != {"ports", "faketime"}:
        raise ValueError('expected an object with exactly the keys "ports" and "faketime"')
    raw_ports, faketime = data["ports"], data["faketime"]
    if not isinstance(raw_ports, dict):
        raise ValueError('"ports" must be an object')
    ports: dict[int, int] = {}
    for key, value in raw_ports.items():
        upstream, proxy = _port(key), _port(value)
        if upstream is None or proxy is None or isinstance(value, str):
            raise ValueError(f'"ports": {key!r}: {value!r} is not a port mapped to a port')
        ports[upstream] = proxy
    if faketime is not None and not (isinstance(faketime, str) and _OFFSET.fullmatch(faketime)):
        raise ValueError(f'"faketime": {faketime!r} is not null or an offset like +1h')
    return NodeLinks(ports=ports, faketime=faketime)


def read_node_links(links_dir: Path, name: str) -> NodeLinks | None:
    """Node ``name``'s links, or None if it has no file (no drill running);
    :class:`LinksFileError` if the file cannot be read or is malformed."""
    try:
        path = links_path(links_dir, name)
    except UsageError as exc:
        raise LinksFileError(str(exc)) from exc
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise LinksFileError(f"links file {path}: {exc}") from exc
    try:
        return parse_node_links(json.loads(text))
    except ValueError as exc:  # json.JSONDecodeError is one
        raise LinksFileError(f"links file {path}: {exc}") from exc


def write_node_links(links_dir: Path, name: str, links: NodeLinks) -> Path:
    """Replace node ``name``'s links file atomically (a temp file, then a rename; mode 0600);
    returns its path."""
    data = (json.dumps(links.to_json()) + "\n").encode()
    return files.write_atomic(links_path(links_dir, name), data, mode=FILE_MODE)


@dataclass
class _Node:
    zookeeper: dict[int, Proxy]
    postgres: dict[int, Proxy]
    faketime: str | None = None

    def proxies(self) -> Iterator[Proxy]:
        yield from self.zookeeper.values()
        yield from self.postgres.values()

    def links(self) -> NodeLinks:
        ports = {upstream: proxy.port for upstream, proxy in self.zookeeper.items()}
        ports.update({upstream: proxy.port for upstream, proxy in self.postgres.items()})
        return NodeLinks(ports=ports, faketime=self.faketime)


class Links:
    """``Links(links_dir, names, zk_ports, pg_ports)``: the links of nodes ``names`` to the
    ZooKeeper servers listening on ``zk_ports`` and the PostgreSQL servers on ``pg_ports``.

    One :class:`~allocator.drill.proxy.Proxy` per node and upstream port, so a fault on one
    node's link leaves every other node's untouched. Nothing happens in the constructor:
    :meth:`open` (or ``with``) starts the proxies and writes the files (mode 0600, folder
    0700). A node started before :meth:`open` talks to the servers directly and cannot be
    cut, and a clock offset takes effect at the node's next start: the drill restarts the
    node for either. Every method may be called from any thread.
    """

    def __init__(
        self,
        links_dir: Path,
        names: Sequence[str],
        zk_ports: Sequence[int],
        pg_ports: Sequence[int],
    ) -> None:
        self.links_dir = Path(links_dir)
        self.names = tuple(validate_name(name) for name in names)
        if len(set(self.names)) != len(self.names):
            raise UsageError(f"node names repeat: {', '.join(self.names)}")
        self.zk_ports = tuple(zk_ports)
        self.pg_ports = tuple(pg_ports)
        if set(self.zk_ports) & set(self.pg_ports):
            raise UsageError("a port cannot be both ZooKeeper's and PostgreSQL's")
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}

    def open(self) -> None:
        """Start every node's proxies and write every node's file (no clock offset)."""
        with self._lock:
            if self._nodes:
                return
            self.links_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            try:
                for name in self.names:
                    node = _Node(zookeeper={}, postgres={})
                    self._nodes[name] = node
                    for port in self.zk_ports:
                        node.zookeeper[port] = Proxy(port)
                    for port in self.pg_ports:
                        node.postgres[port] = Proxy(port)
                    write_node_links(self.links_dir, name, node.links())
            except BaseException:
                self._close_locked()
                raise

    def close(self) -> None:
        """Close every proxy, remove the files, and the folder if it is left empty.

        A node still connected through a proxy sees its connections reset, and new ones
        refused, until it restarts; without its file the shim then starts it with direct
        links."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        nodes, self._nodes = self._nodes, {}
        # Side by side: each close waits for its accept loop's next wake-up.
        closers = [
            threading.Thread(target=proxy.close, name="links-close", daemon=True)
            for node in nodes.values()
            for proxy in node.proxies()
        ]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join()
        for name in nodes:
            with contextlib.suppress(FileNotFoundError):
                links_path(self.links_dir, name).unlink()
        with contextlib.suppress(OSError):  # missing, or not empty: not ours alone
            self.links_dir.rmdir()

    def __enter__(self) -> Links:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def path(self, name: str) -> Path:
        """Node ``name``'s links file."""
        return links_path(self.links_dir, name)

    def ports(self, name: str) -> dict[int, int]:
        """Node ``name``'s proxies: upstream port -> proxy port."""
        with self._lock:
            return dict(self._node(name).links().ports)

    def cut_zookeeper(self, name: str) -> None:
        """Reset node ``name``'s connections to ZooKeeper and refuse new ones."""
        with self._lock:
            for proxy in self._node(name).zookeeper.values():
                proxy.cut()

    def blackhole_zookeeper(self, name: str) -> None:
        """Drop every packet between node ``name`` and ZooKeeper (a partition)."""
        with self._lock:
            for proxy in self._node(name).zookeeper.values():
                proxy.blackhole()

    def blackhole_postgres(self, name: str) -> None:
        """Drop every packet between node ``name`` and PostgreSQL (a partition)."""
        with self._lock:
            for proxy in self._node(name).postgres.values():
                proxy.blackhole()

    def heal(self, name: str) -> None:
        """Restore every link of node ``name`` (its clock offset stays as set)."""
        with self._lock:
            for proxy in self._node(name).proxies():
                proxy.restore()

    def is_cut(self, name: str) -> bool:
        """True while any link of node ``name`` is cut or black-holed."""
        with self._lock:
            return any(p.is_cut or p.is_blackholed for p in self._node(name).proxies())

    def set_clock(self, name: str, offset: str | None) -> None:
        """Skew node ``name``'s wall clock by ``offset`` (``+1h``; None: the true time)
        from its next start on."""
        validate_offset(offset)
        with self._lock:
            node = self._node(name)
            node.faketime = offset
            write_node_links(self.links_dir, name, node.links())

    def clock(self, name: str) -> str | None:
        """Node ``name``'s clock offset, as last set."""
        with self._lock:
            return self._node(name).faketime

    def _node(self, name: str) -> _Node:
        try:
            return self._nodes[name]
        except KeyError:
            state = "is not open" if not self._nodes else f"has no node {name!r}"
            raise UsageError(f"the drill's links {state}") from None

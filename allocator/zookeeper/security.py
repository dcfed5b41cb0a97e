"""How a kazoo client reaches the ensemble: TLS (servers verified against a CA, optionally a
client certificate) and SASL DIGEST-MD5, as kazoo's options, from ``[zookeeper]``.

Files are checked before a client is built (kazoo would only retry a bad one forever), and
a client that cannot finish a TLS handshake is told why (:func:`handshake_problem`).
Operators' side: ``docs/zookeeper-acls.md``.
"""

from __future__ import annotations

import importlib.util
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any

from allocator.config import Config
from allocator.config.sections import SASL_DIGEST_MD5
from allocator.core.errors import (
    AllocatorError,
    ConfigError,
    PrerequisiteError,
    ZooKeeperUnavailableError,
)
from allocator.core.zookeeper_hosts import servers_of

DEFAULT_PORT = 2181
HANDSHAKE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Tls:
    """TLS to the ensemble; the servers' certificates are always verified against ``ca_file``."""

    ca_file: str
    cert_file: str = ""
    key_file: str = ""
    key_password: str = field(default="", repr=False)


@dataclass(frozen=True)
class Sasl:
    """A SASL identity (DIGEST-MD5 only)."""

    username: str
    password: str = field(repr=False)
    mechanism: str = SASL_DIGEST_MD5


@dataclass(frozen=True)
class Transport:
    """TLS and SASL of a client; neither by default (plain TCP, digest auth at most)."""

    tls: Tls | None = None
    sasl: Sasl | None = None

    def kazoo_options(self) -> dict[str, Any]:
        """Keyword arguments of ``KazooClient`` for these settings."""
        options: dict[str, Any] = {}
        if self.tls is not None:
            options.update(
                use_ssl=True,
                verify_certs=True,
                ca=self.tls.ca_file,
                certfile=self.tls.cert_file or None,
                keyfile=self.tls.key_file or None,
                keyfile_password=self.tls.key_password or None,
            )
        if self.sasl is not None:
            options["sasl_options"] = {
                "mechanism": self.sasl.mechanism,
                "username": self.sasl.username,
                "password": self.sasl.password,
            }
        return options


def transport(config: Config) -> Transport:
    """The config's TLS and SASL settings, their files checked (:func:`check_tls`)."""
    zk = config.zookeeper
    tls = None
    if zk.tls:
        tls = Tls(
            ca_file=zk.tls_ca_file,
            cert_file=zk.tls_cert_file,
            key_file=zk.tls_key_file,
            key_password=zk.tls_key_password.get_secret_value(),
        )
        check_tls(tls)
    sasl = None
    if zk.sasl_username:
        require_sasl_package()
        sasl = Sasl(zk.sasl_username, zk.sasl_password.get_secret_value(), zk.sasl_mechanism)
    return Transport(tls=tls, sasl=sasl)


SASL_PACKAGE_HINT = "pip install 'snowflake-block-allocator[node,sasl]'"


def require_sasl_package() -> None:
    """kazoo speaks SASL through ``pure-sasl``, an extra of its own (``sasl``): it ships no
    wheel, and the ``node`` extra installs from wheels alone. Without it kazoo would fail the
    handshake in its connection thread, which only shows as a connect time-out."""
    if importlib.util.find_spec("puresasl") is None:
        raise PrerequisiteError(
            f"zookeeper.sasl_username needs the pure-sasl package: {SASL_PACKAGE_HINT}"
        )


def file_problems(config: Config) -> list[str]:
    """What :func:`transport` would refuse in the config's TLS files, one line each (for
    ``config check`` and ``run --check``, which build no client)."""
    try:
        transport(config)
    except ConfigError as exc:
        return [str(exc)]
    return []


def check_tls(tls: Tls) -> None:
    """Raise :class:`ConfigError` naming the key if a file cannot be read or loaded: the CA
    as trust anchors, the certificate with its key (and its password). The password is
    always given, empty if unset: without one OpenSSL would prompt on the terminal."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(tls.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"zookeeper.tls_ca_file={tls.ca_file}: {_reason(exc)}") from None
    if not tls.cert_file:
        return
    for key, path in (("tls_cert_file", tls.cert_file), ("tls_key_file", tls.key_file)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ConfigError(f"zookeeper.{key}={path}: {_reason(exc)}") from None
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file, tls.key_password)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"zookeeper.tls_cert_file={tls.cert_file}, zookeeper.tls_key_file={tls.key_file}: "
            f"{_reason(exc)} (a PEM certificate and its key; zookeeper.tls_key_password if "
            "the key is encrypted)"
        ) from None


def _reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return f"not usable ({exc.reason or exc})"
    return f"cannot read the file ({exc.strerror or exc})"


def handshake_problem(hosts: str, tls: Tls) -> str | None:
    """Why TLS to ``hosts`` fails: the first server whose handshake is refused (a
    certificate the CA did not sign, a server that does not speak TLS on that port), as one
    line; None if no server refused one (unreachable, or the handshake works)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # as kazoo: the CA is the check
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(tls.ca_file)
    if tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file, tls.key_password)
    for server in servers_of(hosts).split(","):
        host, port = _host_port(server.strip())
        try:
            with (
                socket.create_connection((host, port), timeout=HANDSHAKE_TIMEOUT_S) as raw,
                context.wrap_socket(raw, server_hostname=host),
            ):
                pass
        except ssl.SSLError as exc:
            return f"TLS handshake with {host}:{port} failed: {exc.reason or exc}"
        except OSError:
            continue
    return None


def _host_port(server: str) -> tuple[str, int]:
    if server.startswith("["):
        host, _, rest = server[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else DEFAULT_PORT
    host, _, port = server.partition(":")
    return host, int(port) if port else DEFAULT_PORT


def unanswered(config: Config, timeout_s: float) -> AllocatorError:
    """Why no session began within ``timeout_s``: :class:`ZooKeeperUnavailableError`, or with
    TLS a :class:`ConfigError` when a server refuses the handshake (a certificate our CA did
    not sign, a port without TLS): kazoo itself only times out, and never falls back to
    plain TCP."""
    zk = config.zookeeper
    tls = transport(config).tls
    problem = handshake_problem(zk.hosts, tls) if tls is not None else None
    if problem is not None:
        return ConfigError(
            f"{problem}; check zookeeper.tls_ca_file (the CA that signed the servers' "
            "certificates) and that zookeeper.hosts names their secureClientPort"
        )
    return ZooKeeperUnavailableError(
        f"no ZooKeeper server answered at {zk.hosts} within {timeout_s:g} s"
    )

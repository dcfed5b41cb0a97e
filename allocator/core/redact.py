"""Secrets kept out of every output: connection strings masked, known secret values masked.

The CLI passes every error line through :func:`redact` and :mod:`allocator.core.logs` every
log line, because libpq's own messages echo pieces of the connection string.
"""

from __future__ import annotations

import re
import threading
from urllib.parse import unquote, urlsplit

MASK = "***"
SECRET_PARAMETERS = ("password", "sslpassword")
MIN_REGISTERED_CHARS = 6

# Any URL: libpq reads postgres:// and postgresql://, but a password in another scheme's
# user info (a mistyped or foreign URL) is just as secret.
_URL = re.compile(r"(?<![\w+.-])[A-Za-z][A-Za-z0-9+.-]*://\S*")
# libpq's key=value syntax: a value is quoted ('' with \' and \\ escapes) or runs to a space.
_PAIR = re.compile(
    r"(?<![\w%])(?P<key>" + "|".join(SECRET_PARAMETERS) + r")(?P<eq>\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'?|(?:[^\s'\\]|\\.)+)"
)

_lock = threading.Lock()
_registered: tuple[str, ...] = ()


def mask_conninfo(conninfo: str) -> str:
    """``conninfo`` (a URL or ``key=value`` pairs) with every secret parameter masked.

    The secret parameters are :data:`SECRET_PARAMETERS`: ``password`` and ``sslpassword``
    (the client key's passphrase); every other one (``passfile``, ``sslkey`` name files) is
    a name, a path or a setting. In a URL, the password in the user info and the query's
    ``password=``/``sslpassword=`` (percent-encoded names too) are masked; a URL whose
    password cannot be told apart (an unescaped ``/``, ``?`` or ``#`` in it, a malformed
    host) is masked whole after the scheme.
    """
    if _URL.match(conninfo):
        return _mask_url(conninfo)
    return _PAIR.sub(_masked_pair, conninfo)


def carries_secret(conninfo: str) -> bool:
    """True when ``conninfo`` holds a password (or another secret parameter).

    The CLI refuses such a string on its command line, where it would show in the process
    list.
    """
    return mask_conninfo(conninfo) != conninfo


def redact(text: str) -> str:
    """``text`` with every connection-string secret and every registered value masked.

    Every URL in it (any scheme) goes through :func:`mask_conninfo`, then every
    ``password=`` / ``sslpassword=`` pair, then every registered value.
    """
    text = _URL.sub(lambda match: _mask_url(match.group()), text)
    text = _PAIR.sub(_masked_pair, text)
    for value in _registered:
        if value in text:
            text = text.replace(value, MASK)
    return text


def register(*values: str) -> None:
    """Remember secret values for :func:`redact`, for the life of the process.

    The configuration registers ``zookeeper.auth``, ``node.admin_token`` and the passwords
    of ``postgres.url`` when it loads. A value shorter than :data:`MIN_REGISTERED_CHARS` is
    not registered (masking it would garble ordinary words); such a password is still masked
    where it stands in a URL or a ``password=`` pair.
    """
    global _registered
    fresh = {value for value in values if len(value) >= MIN_REGISTERED_CHARS}
    if not fresh.difference(_registered):
        return
    with _lock:
        # Longest first, so a secret that contains another is masked whole.
        _registered = tuple(sorted(fresh.union(_registered), key=lambda v: (-len(v), v)))


def url_secrets(url: str) -> list[str]:
    """The secret values in a connection URL (raw and percent-decoded), for :func:`register`."""
    found: list[str] = []
    try:
        parts = urlsplit(url)
    except ValueError:
        return found
    userinfo, at, _host = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        found.append(userinfo.partition(":")[2])
    for piece in parts.query.split("&"):
        key, _eq, value = piece.partition("=")
        if unquote(key) in SECRET_PARAMETERS:
            found.append(value)
    return [v for raw in found for v in {raw, unquote(raw)} if v]


def _masked_pair(match: re.Match[str]) -> str:
    return f"{match['key']}{match['eq']}{MASK}"


def _mask_url(url: str) -> str:
    scheme = url.partition("://")[0]
    try:
        parts = urlsplit(url)
    except ValueError:
        return f"{scheme}://{MASK}"
    userinfo, at, hostinfo = parts.netloc.rpartition("@")
    rest = url[len(scheme) + 3 + len(parts.netloc) :]
    if not at and "@" in rest:
        # An "@" past the parsed user info (an unescaped "/", "?" or "#" in the password):
        # where the password ends cannot be told, so everything after the scheme is hidden.
        return f"{scheme}://{MASK}"
    netloc = parts.netloc
    user, colon, password = userinfo.partition(":")
    if colon and password:
        netloc = f"{user}:{MASK}@{hostinfo}"
    path, question, query = rest.partition("?")
    query, hash_sign, fragment = query.partition("#")
    if not question:
        path, hash_sign, fragment = path.partition("#")
    query = "&".join(_mask_query_piece(piece) for piece in query.split("&"))
    return f"{scheme}://{netloc}{path}{question}{query}{hash_sign}{fragment}"


def _mask_query_piece(piece: str) -> str:
    key, eq, _value = piece.partition("=")
    return f"{key}={MASK}" if eq and unquote(key) in SECRET_PARAMETERS else piece

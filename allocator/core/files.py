"""Replacing a file atomically: what every writer of a state, record or report file uses."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PRIVATE_MODE = 0o600
PUBLIC_MODE = 0o644


def write_atomic(path: Path, data: bytes, *, mode: int = PUBLIC_MODE) -> Path:
    """Replace ``path`` with ``data`` atomically; returns ``path``. The folder must exist.

    Writes a temporary file beside the target (``O_EXCL`` and ``O_NOFOLLOW``: never through
    a link, never into someone else's file), sets ``mode`` whatever the umask
    (:data:`PRIVATE_MODE` for anything holding a secret or a session, :data:`PUBLIC_MODE`
    for what people read), fsyncs it and renames it over the target, so a reader sees the
    old file or the new one, never half of one. The temporary name carries the pid: one left
    by an earlier process of the same pid that died half-way is removed first; one this
    write leaves after a failure is removed before the error goes on.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # left by a process of this pid that died half-way
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), mode)  # whatever the umask
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path

"""Operators' audited changes: each carries a reason, the audit record's why."""

from __future__ import annotations

from allocator.core.errors import UsageError

MAX_REASON_CHARS = 1000
"""As the audited SQL functions check it (AL106)."""


def check_reason(reason: str, what: str) -> str:
    """``reason`` if it says why ``what`` (1..1000 characters, not only blanks); else a
    :class:`UsageError` before anything is changed."""
    if not reason.strip():
        raise UsageError(f"--reason must say why {what} (it is the audit record)")
    if len(reason) > MAX_REASON_CHARS:
        raise UsageError(
            f"--reason is {len(reason)} characters long; at most {MAX_REASON_CHARS} are kept"
        )
    return reason

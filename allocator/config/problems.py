"""How a configuration problem reads: ``key: message (got value, from source)``, one line
each, in the project's words rather than pydantic's; a secret is never shown.
"""

from __future__ import annotations

import difflib
import re

from pydantic_core import ErrorDetails

from allocator.config.secrets import MASK, SECRET_KEYS, mask_url
from allocator.config.sections import KEYS, SECTIONS
from allocator.config.values import NUMBER

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")

_MESSAGES = {
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "less_than": "must be < {lt}",
    "literal_error": "must be one of {expected}",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "string_type": "must be a string",
    "extra_forbidden": "unknown key",
}


def error_message(error: ErrorDetails) -> str:
    """What pydantic's ``error`` says, in the project's words."""
    ctx = error.get("ctx", {})
    if error["type"] == "value_error":
        return str(ctx["error"])
    template = _MESSAGES.get(error["type"])
    return template.format(**ctx) if template else error["msg"]


def show_value(key: str, value: object) -> str:
    """A bad value for an error line; secrets stay hidden, and a value that holds a line
    break or another odd character is shown quoted, so the line stays one line."""
    if key in SECRET_KEYS:
        if key == "postgres.url" and isinstance(value, str):
            masked = mask_url(value)
            return masked if masked.isprintable() else repr(masked)  # one line, always
        return MASK
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and not NUMBER.fullmatch(value):
        return repr(value)
    return str(value)


def unknown_key(key: str) -> str:
    """The problem of a key that names no key (or a section given a value), with the
    closest known key when there is one."""
    if key in SECTIONS:
        return f"{key}: must be a table of keys, like [{key}]"
    close = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.75)
    # A key that is empty, blank or holds odd characters (a newline) is shown quoted.
    shown = key if _PLAIN_KEY.fullmatch(key) else repr(key)
    return f"{shown}: unknown key" + (f"; did you mean {close[0]}?" if close else "")

"""Query values and request headers as numbers, or a 400 that names what was wrong.

One parser for every handler: a value that is not a finite number, not an
integer where one is needed, or outside what SQLite holds, raises
:class:`BadParam` instead of reaching ``int()`` or the index.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from email.message import Message

# The largest integer a query may carry: within SQLite's INTEGER and exact as a float.
MAX_INT = 2**53
_DIGITS = re.compile(r"^[0-9]{1,18}$")


class BadParam(ValueError):
    """A malformed query value or header; ``param`` names it, the message says what is expected."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _raw(q: Mapping[str, list[str]], name: str) -> str | None:
    values = q.get(name)
    return values[0] if values else None


def query_float(q: Mapping[str, list[str]], name: str) -> float | None:
    """``name`` as a finite float; ``None`` when absent."""
    raw = _raw(q, name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadParam(name, f"{name}={raw[:40]!r} is not a number") from None
    if not math.isfinite(value):
        raise BadParam(name, f"{name}={raw[:40]!r} is not a finite number")
    return value


def query_int(
    q: Mapping[str, list[str]], name: str, default: int, lo: int = -MAX_INT, hi: int = MAX_INT
) -> int:
    """``name`` as an integer (``400`` or ``400.0``), clamped to ``[lo, hi]``; ``default`` when absent."""
    if _raw(q, name) is None:
        return default
    value = query_float(q, name)
    assert value is not None
    if not value.is_integer() or abs(value) > MAX_INT:
        raise BadParam(name, f"{name} must be an integer between {-MAX_INT} and {MAX_INT}")
    return max(lo, min(int(value), hi))


def query_indices(q: Mapping[str, list[str]], name: str) -> tuple[int, ...] | None:
    """``name`` as comma-separated indices (``0`` or ``0,3``); ``None`` when absent or ``all``."""
    raw = _raw(q, name)
    if raw is None or raw == "all":
        return None
    try:
        values = tuple(int(v) for v in raw.split(","))
    except ValueError:
        values = (-1,)
    if any(v < 0 or v > MAX_INT for v in values):
        raise BadParam(name, f"{name}={raw[:40]!r}: give indices such as 0 or 0,3, or all")
    return values


def content_length(headers: Mapping[str, str] | Message) -> int:
    """The request's ``Content-Length`` (0 when absent); only plain decimal digits are accepted."""
    raw = headers.get("Content-Length")
    if raw is None:
        return 0
    value = raw.strip(" \t")  # the blanks HTTP allows around a value, nothing more
    if not _DIGITS.match(value):
        raise BadParam("Content-Length", f"Content-Length {raw[:40]!r} is not a byte count")
    return int(value)

"""A request's JSON body: its length checked from the header, read whole, parsed, or a 400."""

from __future__ import annotations

import json
from email.message import Message
from typing import Any, Protocol

from steadytune.web.params import content_length

MAX_BODY = 4096


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class BodyError(ValueError):
    """A body that is not what the route takes; the message says what to send."""


def read_json_body(headers: Message, rfile: Readable, limit: int = MAX_BODY) -> tuple[dict[str, Any], bool]:
    """The body as a JSON object, and whether it arrived whole (a short one: close the connection).

    Raises:
        steadytune.web.params.BadParam: a ``Content-Length`` that is not a byte count.
        BodyError: no body, one over ``limit``, not JSON, or not an object.
    """
    length = content_length(headers)
    if length <= 0 or length > limit:
        raise BodyError(f"send a JSON body of at most {limit // 1024} KiB")
    raw = rfile.read(length)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise BodyError("the body is not JSON") from None
    if not isinstance(body, dict):
        raise BodyError('send a JSON object, e.g. {"confirm": true}')
    return body, len(raw) == length

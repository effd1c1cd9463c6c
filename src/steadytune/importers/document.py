"""Reading a JSON document whole, up to a bound said before a byte is read.

A JSON document (a ``trainer_state.json``, Megatron's golden values, a list of per-step dicts)
can only be parsed whole, and parsing holds several times the file in objects. A file past
:data:`MAX_DOCUMENT_BYTES` is refused from its size alone, whether detection found the format or
``--format`` named it: the error names the file, its size and the bound.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from steadytune.importers.series import UnreadableLog
from steadytune.regularfile import FileTooLarge, read_bytes

# A trainer_state.json of a million steps is a few hundred MB.
MAX_DOCUMENT_BYTES = 1 << 30


def document_bytes(path: Path, hint: str = "") -> bytes:
    """The bytes of the JSON document at ``path``. Raises :class:`UnreadableLog` for one over
    :data:`MAX_DOCUMENT_BYTES` (``hint`` said after the reason), read no further than the bound."""
    limit = MAX_DOCUMENT_BYTES
    try:
        if os.stat(path).st_size > limit:  # refused before a byte is read
            raise FileTooLarge
        return read_bytes(path, limit)
    except FileTooLarge:  # also a file that grew past the bound while it was read
        size = os.stat(path).st_size
        raise UnreadableLog(
            f"{path.name} is {_size(size)} of JSON in one line or document, over the {_size(limit)} "
            f"a document is read whole to{hint}"
        ) from None


def read_document(path: Path) -> Any:
    """The JSON document at ``path``, bounded as :func:`document_bytes`; ``ValueError`` if not JSON."""
    return json.loads(document_bytes(path).decode("utf-8"))


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}".replace(".0 ", " ")
    return f"{n} bytes"

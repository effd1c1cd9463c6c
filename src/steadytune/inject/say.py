"""What the injected guard says on the tool's stderr: one line per kind of trouble, once.

Stdlib only: the startup hook imports it in every Python process of the tool, and the
tool's own output must stay the tool's.
"""

from __future__ import annotations

import sys

_said: set[str] = set()


def warn(what: str, reason: object) -> None:
    """One line on stderr, once per kind: the tool's own output stays the tool's."""
    if what in _said:
        return
    _said.add(what)
    text = f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
    print(f"steadytune: {what}: {text}", file=sys.stderr, flush=True)

"""The entry point the startup hook calls once ``transformers.trainer`` is imported.

Stdlib only at import time: it runs in a tool's own virtualenv, and a program that
never imports transformers must not pay for it.
"""

from __future__ import annotations

import sys
from types import ModuleType

_said: set[str] = set()


def warn(what: str, reason: object) -> None:
    """One line on stderr, once per kind: the tool's own output stays the tool's."""
    if what in _said:
        return
    _said.add(what)
    text = f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
    print(f"steadytune: {what}: {text}", file=sys.stderr, flush=True)


def patch_transformers_trainer(module: ModuleType) -> None:
    """Give ``module.Trainer`` (and every subclass) the guard; on any failure, leave it untouched."""
    try:
        from steadytune.inject.trainer import install

        install(module.Trainer)
    except Exception as exc:
        warn("guard not injected", exc)

"""The entry point the startup hook calls once ``transformers.trainer`` is imported.

Stdlib only at import time: it runs in a tool's own virtualenv, and a program that
never imports transformers must not pay for it.
"""

from __future__ import annotations

from types import ModuleType

from steadytune.inject.say import warn


def patch_transformers_trainer(module: ModuleType) -> None:
    """Give ``module.Trainer`` (and every subclass) the guard; on any failure, leave it untouched."""
    try:
        from steadytune.inject.trainer import install

        install(module.Trainer)
    except Exception as exc:
        warn("guard not injected", exc)

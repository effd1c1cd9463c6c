"""The guard injected into a training tool's own HF ``Trainer``, without its cooperation.

:func:`inject_env` gives the environment a child needs; the child's startup hook
(``startup/sitecustomize.py``) does the rest when transformers is imported. See
``docs/inject.md``.
"""

from __future__ import annotations

from steadytune.inject.env import ATTEMPT_ENV, RUN_ENV, STARTUP_DIR, SWITCH_ENV, inject_env

__all__ = ["ATTEMPT_ENV", "RUN_ENV", "STARTUP_DIR", "SWITCH_ENV", "inject_env"]

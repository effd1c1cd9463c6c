"""steadytune: keeps LLM fine-tuning runs, and the GPU servers they run on, steady."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Guard", "__version__"]

if TYPE_CHECKING:
    from steadytune.guard.core import Guard


def __getattr__(name: str) -> Any:
    # The guard needs torch; import it only when someone asks for it, so that the
    # supervisor (which never imports torch) can import this package freely.
    if name == "Guard":
        from steadytune.guard.core import Guard

        return Guard
    raise AttributeError(name)

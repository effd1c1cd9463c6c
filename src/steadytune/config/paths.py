"""Where a path written in a run config points: ``~`` expanded, a relative path taken from a base.

Kept apart from the schema so a light command (``estimate``) resolves paths exactly as ``run``,
``check`` and ``submit`` do without loading the whole run schema.
"""

from __future__ import annotations

from pathlib import Path


def resolve_path(value: str, base: Path) -> Path:
    """The path ``value`` names: ``~`` expanded, and a relative path taken from ``base``."""
    try:
        p = Path(value).expanduser()
    except RuntimeError:  # ~user of a user this machine does not know: the path as written
        p = Path(value)
    return p if p.is_absolute() else (base / p)

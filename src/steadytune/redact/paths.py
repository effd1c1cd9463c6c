"""Take the machine out of what a repro bundle says: no absolute path, home directory or user name.

A bundle is meant to be attached to a bug report. Paths in its config, plan,
events, metrics and environment snapshot become:

- relative to the run directory where they point inside it (``checkpoints/checkpoint-10``;
  the run directory itself is ``.``);
- ``~/...`` under the home directory (``~`` expands again where the bundle is checked);
- ``<abs>/<name>`` anywhere else (the name is kept: it says which file, not where).

Absolute paths are found inside any text (a message that names a file is redacted
too), POSIX-style only. The ``user`` and ``host`` fields of events become ``<user>``
and ``<host>``. Torch-free.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

ABS = "<abs>"
IDENTITY_FIELDS = {"user": "<user>", "username": "<user>", "host": "<host>", "hostname": "<host>"}

# An absolute path: a "/" that does not continue a word, a relative path, a URL ("https://h/p")
# or a placeholder, up to the next space, quote or bracket ("a / b" is no path). "file:///x" is one.
_PATH = re.compile(r"(?:(?<![\w.~<>/:-])|(?<=file://))/[^\s\"'`<>|,;(){}\[\]]+")
_TRAILING = ".:"  # sentence punctuation after a path is not part of it


def _variants(path: Path | None) -> list[str]:
    if path is None:
        return []
    out = {os.path.abspath(path), os.path.realpath(path)}
    return sorted((p.rstrip("/") for p in out if p.rstrip("/")), key=len, reverse=True)


def _under(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` ("" for root itself), or None when it is not under it."""
    if path == root:
        return ""
    if path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return None


class PathRedactor:
    """Rewrites the absolute paths of text and JSON-like values (see the module docstring)."""

    def __init__(self, run_root: Path | None, home: Path | None = None) -> None:
        home = Path.home() if home is None else home
        self.roots = _variants(run_root)
        self.homes = [h for h in _variants(home) if h != ""]

    def path(self, path: str) -> str:
        """One absolute path, rewritten."""
        norm = os.path.normpath(path) if path.startswith("/") else path
        if norm.startswith("//"):
            norm = "/" + norm.lstrip("/")
        for root in self.roots:
            rel = _under(norm, root)
            if rel is not None:
                return rel or "."
        for home in self.homes:
            rel = _under(norm, home)
            if rel is not None:
                return "~/" + rel if rel else "~"
        name = norm.rstrip("/").rsplit("/", 1)[-1]
        return f"{ABS}/{name}" if name else ABS

    def _sub(self, match: re.Match[str]) -> str:
        token = match.group(0)
        stripped = token.rstrip(_TRAILING)
        tail = token[len(stripped) :]
        if not stripped:
            return token
        return self.path(stripped) + tail

    def text(self, text: str) -> str:
        """``text`` with every absolute path in it rewritten."""
        return _PATH.sub(self._sub, text) if "/" in text else text

    def value(self, obj: Any) -> Any:
        """A JSON/YAML-like value with its strings rewritten and identity fields replaced."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                if isinstance(k, str) and k in IDENTITY_FIELDS and isinstance(v, str) and v:
                    out[k] = IDENTITY_FIELDS[k]
                else:
                    out[k] = self.value(v)
            return out
        if isinstance(obj, (list, tuple)):
            return [self.value(v) for v in obj]
        return obj

    def names(self, text: str) -> bool:
        """Whether ``text`` names the run directory or the home directory by absolute path."""
        return any(p in text for p in (*self.roots, *self.homes))

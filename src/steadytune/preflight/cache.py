"""The tokenized-data cache on disk: list its entries, pick which to remove, remove them.

Each entry is a folder ``<data cache>/<key>/`` (a saved ``datasets.Dataset``) whose key
covers the data file's bytes, the tokenizer, the template and the sequence length
(:func:`steadytune.train.data.cache_key`); ``meta.json`` inside says where it came from,
and its modification time is the entry's last use. Choosing what to remove is pure
(:func:`select_for_removal`), so the rule is tested with exact numbers.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

META = "meta.json"  # the same name as steadytune.train.data.CACHE_META
# A partial build (".<key>.<pid>.tmp") younger than this may still be in progress.
STALE_PARTIAL_S = 3600.0

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.I)
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """``"30s"``, ``"15m"``, ``"12h"``, ``"7d"``, ``"2w"`` -> seconds.

    Raises:
        ValueError: the text is not a number with one of those units.
    """
    m = _DURATION.match(str(text))
    if m is None:
        raise ValueError(
            f"cannot read {text!r} as a duration; write a number with s, m, h, d or w, e.g. 7d or 12h"
        )
    return float(m.group(1)) * _SECONDS[m.group(2).lower()]


def format_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{max(0.0, seconds):.0f}s"


@dataclass(frozen=True)
class CacheEntry:
    key: str
    path: Path
    size_bytes: int
    created: float
    last_used: float
    source: str | None = None
    samples: int | None = None
    max_seq_length: int | None = None
    tokenizer: str | None = None
    partial: bool = False  # an interrupted build, not an entry


def folder_size(path: Path) -> int:
    total = 0
    for f in path.rglob("*"):
        try:
            if f.is_file() and not f.is_symlink():
                total += f.stat().st_size
        except OSError:
            continue
    return total


def read_entry(path: Path) -> CacheEntry:
    meta: dict = {}
    meta_file = path / META
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        last_used = meta_file.stat().st_mtime
    except (OSError, ValueError):
        last_used = path.stat().st_mtime
    partial = path.name.startswith(".")
    key = path.name.lstrip(".").split(".")[0] if partial else path.name
    return CacheEntry(
        key=key,
        path=path,
        size_bytes=folder_size(path),
        created=float(meta.get("created", path.stat().st_mtime)),
        last_used=last_used,
        source=meta.get("source"),
        samples=meta.get("samples"),
        max_seq_length=meta.get("max_seq_length"),
        tokenizer=meta.get("tokenizer"),
        partial=partial,
    )


def list_entries(cache_dir: Path) -> list[CacheEntry]:
    """Every entry (and partial build) in ``cache_dir``, least recently used first."""
    if not cache_dir.is_dir():
        return []
    out = []
    for child in cache_dir.iterdir():
        if child.is_dir():
            try:
                out.append(read_entry(child))
            except OSError:
                continue  # removed while we looked
    return sorted(out, key=lambda e: e.last_used)


def select_for_removal(
    entries: list[CacheEntry], now: float, max_size: int | None = None, older_than: float | None = None
) -> list[CacheEntry]:
    """What ``cache clean`` removes: entries unused for longer than ``older_than`` seconds, then
    the least recently used until the rest fits in ``max_size`` bytes. Partial builds older than
    an hour always go (younger ones may still be writing).
    """
    doomed: list[CacheEntry] = []
    kept: list[CacheEntry] = []
    for e in sorted(entries, key=lambda e: e.last_used):
        if e.partial:
            (doomed if now - e.last_used > STALE_PARTIAL_S else kept).append(e)
        elif older_than is not None and now - e.last_used > older_than:
            doomed.append(e)
        else:
            kept.append(e)
    if max_size is not None:
        total = sum(e.size_bytes for e in kept)
        for e in [e for e in kept if not e.partial]:
            if total <= max_size:
                break
            doomed.append(e)
            total -= e.size_bytes
    return doomed


def remove(entries: list[CacheEntry]) -> int:
    """Delete the entries; returns the bytes freed. A run that has an entry open keeps reading
    it (its memory-mapped files stay until closed) and a later run rebuilds it."""
    freed = 0
    for e in entries:
        shutil.rmtree(e.path, ignore_errors=True)
        if not e.path.exists():
            freed += e.size_bytes
    return freed


def now() -> float:
    return time.time()

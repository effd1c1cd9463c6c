"""The dataset scan's answer, kept on disk until one of its inputs changes.

The scan is the one slow part of the preflight: it loads the tokenizer, and with it
torch, and tokenizes every sample. Its findings depend only on the data files, the
tokenizer's files, the ``data`` settings and the code that scans, so ``run`` (which
performs the check before every start) need not pay for it twice on the same inputs.

The key is built without reading any file's contents or importing torch: the size,
modification time and inode of the data files and of every non-weight file of the
model folder, the ``data`` and ``model`` settings, the installed versions of
transformers and tokenizers, and the source of the scanning code. A model that is
not a local folder (a hub name) has no such key, so its scan is never cached.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from steadytune.preflight.result import Check

_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt")
_VERSION = 1


def _stat(path: Path) -> list[Any]:
    try:
        st = path.stat()
    except OSError:
        return [str(path), None]
    return [str(path), st.st_size, st.st_mtime_ns, st.st_ino]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _code() -> str:
    """The scanning code itself: a change to it is a change to the answer."""
    from steadytune.preflight import datascan
    from steadytune.train import data

    h = hashlib.sha256()
    for mod in (datascan, data):
        h.update(Path(mod.__file__ or "").read_bytes())
    return h.hexdigest()


def scan_key(data: dict[str, Any], model: dict[str, Any]) -> str | None:
    """The cache key of a scan of ``data`` (the config's ``data`` section) for ``model``; None:
    uncacheable."""
    folder = Path(str(model.get("name_or_path", ""))).expanduser()
    if not folder.is_dir():
        return None
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.endswith(_WEIGHTS))
    inputs = [
        _VERSION,
        data,
        {k: model.get(k) for k in ("name_or_path", "trust_remote_code")},
        [_stat(Path(str(data[k]))) for k in ("train_file", "eval_file") if data.get(k)],
        [_stat(p) for p in files],
        [_version("transformers"), _version("tokenizers")],
        _code(),
    ]
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:32]


def cached_scan(key: str | None, folder: Path, scan: Callable[[], Any]) -> tuple[Any, bool]:
    """``scan()``'s DataScan, or the one stored under ``key`` in ``folder``; and whether it was stored."""
    from steadytune.preflight.datascan import DataScan

    path = folder / f"{key}.json" if key else None
    if path is not None and path.is_file():
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            raw["checks"] = [Check(**c) for c in raw["checks"]]
            return DataScan(**raw), True
        except (OSError, ValueError, TypeError, KeyError):
            pass  # unreadable or from another layout: scan again and replace it
    result = scan()
    if path is not None:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(result)), encoding="utf-8")
        os.replace(tmp, path)
    return result, False

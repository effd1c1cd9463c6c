"""Checkpoint manifests: what a checkpoint holds, written last, checked before any resume.

A checkpoint directory without a valid ``MANIFEST.json`` does not exist for
resume. The manifest lists every file with its size and sha256, so a truncated
or bit-flipped file is caught before a worker loads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steadytune.rundir import atomic_write_text, fsync_dir

MANIFEST = "MANIFEST.json"
MANIFEST_VERSION = 1
_STEP_RE = re.compile(r"^checkpoint-(\d+)$")
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def checkpoint_step(path: Path) -> int | None:
    """The step of a ``checkpoint-<step>`` directory, or None for any other name."""
    m = _STEP_RE.match(path.name)
    return int(m.group(1)) if m else None


def _files(ckpt: Path) -> list[Path]:
    return sorted(
        p
        for p in ckpt.rglob("*")
        if p.is_file() and p.name != MANIFEST and not p.name.startswith(".manifest")
    )


def fsync_tree(root: Path) -> None:
    """fsync every file and folder below ``root`` so a rename after it publishes durable data."""
    for p in _files(root):
        with open(p, "rb") as f:
            os.fsync(f.fileno())
    for d in sorted({p.parent for p in _files(root)} | {root}, key=lambda x: len(x.parts), reverse=True):
        fsync_dir(d)


def write_manifest(ckpt: Path, step: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Hash every file of ``ckpt`` and write ``MANIFEST.json`` atomically, last."""
    files = {
        str(p.relative_to(ckpt)): {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in _files(ckpt)
    }
    manifest = {
        "version": MANIFEST_VERSION,
        "step": step,
        "created_ts": time.time(),
        "total_bytes": sum(f["size"] for f in files.values()),
        "files": files,
        **(extra or {}),
    }
    atomic_write_text(ckpt / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


@dataclass(frozen=True)
class Verdict:
    """The result of checking one checkpoint against its manifest."""

    path: Path
    ok: bool
    reason: str = ""
    step: int | None = None
    total_bytes: int = 0


def read_manifest(ckpt: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((ckpt / MANIFEST).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError, OSError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


def verify(ckpt: Path, deep: bool = True) -> Verdict:
    """Check ``ckpt`` against its manifest: presence, sizes and (``deep``) sha256 of every file.

    Files present but not listed are tolerated (a reader may add caches); files
    listed but missing, short, long or changed are not.
    """
    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        return Verdict(ckpt, False, "not a directory")
    if not (ckpt / MANIFEST).exists():
        return Verdict(ckpt, False, "no MANIFEST.json (save did not finish)")
    manifest = read_manifest(ckpt)
    if manifest is None:
        return Verdict(ckpt, False, "MANIFEST.json is unreadable")
    step = manifest.get("step")
    if not manifest["files"]:
        return Verdict(ckpt, False, "MANIFEST.json lists no files", step)
    for rel, meta in manifest["files"].items():
        p = ckpt / rel
        if not p.is_file():
            return Verdict(ckpt, False, f"{rel} is missing", step)
        size = p.stat().st_size
        if size != meta.get("size"):
            return Verdict(
                ckpt, False, f"{rel} has {size} bytes, manifest says {meta.get('size')} (truncated?)", step
            )
        if deep and sha256_file(p) != meta.get("sha256"):
            return Verdict(ckpt, False, f"{rel} sha256 mismatch (corrupted)", step)
    return Verdict(ckpt, True, "", step, int(manifest.get("total_bytes", 0)))


def list_checkpoints(root: Path) -> list[Path]:
    """``checkpoint-<step>`` directories under ``root``, newest step first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0, reverse=True)


def newest_verified(
    root: Path, max_step: int | None = None, deep: bool = True
) -> tuple[Verdict | None, list[Verdict]]:
    """The newest checkpoint that verifies (at or before ``max_step``), and those skipped on the way."""
    skipped: list[Verdict] = []
    for ckpt in list_checkpoints(root):
        step = checkpoint_step(ckpt)
        if max_step is not None and step is not None and step > max_step:
            continue
        verdict = verify(ckpt, deep=deep)
        if verdict.ok:
            return verdict, skipped
        skipped.append(verdict)
    return None, skipped

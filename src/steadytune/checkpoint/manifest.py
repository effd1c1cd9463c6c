"""Checkpoint manifests: what a checkpoint holds, written last, checked before any resume.

A checkpoint directory without a valid ``MANIFEST.json`` does not exist for
resume. The manifest lists every file with its size and sha256, so a truncated
or bit-flipped file is caught before a worker loads it.

Every reader of a manifest goes through :func:`load_manifest`, which accepts
only plain relative paths that stay inside the checkpoint folder (no absolute
path, no ``..``, no symlink leading out): a manifest naming any other file is
invalid, so nothing (resume, repro bundle, dashboard) reads or reports it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from steadytune.regularfile import open_fd, open_regular, read_text
from steadytune.rundir import atomic_write_text, fsync_dir

MANIFEST = "MANIFEST.json"
MANIFEST_VERSION = 1
_STEP_RE = re.compile(r"^checkpoint-(\d+)$")
_CHUNK = 1 << 20
_SEAL_CHUNK = 8 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open_regular(path, "rb") as f:
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


def _seal_file(path: Path) -> dict[str, Any]:
    """Hash ``path`` and fsync it through the same descriptor: one open and one read per file."""
    h = hashlib.sha256()
    size = 0
    with open(open_fd(path), "rb", buffering=0) as f:
        buf = bytearray(_SEAL_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])  # hashlib drops the GIL on large buffers: files hash in parallel
            size += n
        os.fsync(f.fileno())
    return {"size": size, "sha256": h.hexdigest()}


def seal_tree(root: Path, workers: int | None = None) -> dict[str, dict[str, Any]]:
    """fsync and hash every file below ``root`` in one pass, then fsync its folders.

    What the manifest lists (``{relative path: {size, sha256}}``). The files are read
    while they are still in the page cache, a few at a time (``workers``, default up to
    4): hashing and fsync both release the GIL, so a checkpoint's shards, optimizer
    state and small files overlap instead of queueing.
    """
    files = _files(root)
    n = workers or min(4, os.cpu_count() or 1, max(1, len(files)))
    if n <= 1 or len(files) <= 1:
        sealed = [_seal_file(p) for p in files]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="steadytune-seal") as pool:
            # Largest first: the long file starts at once and the small ones fill in around it.
            order = sorted(range(len(files)), key=lambda i: -files[i].stat().st_size)
            done = dict(zip(order, pool.map(lambda i: _seal_file(files[i]), order), strict=True))
        sealed = [done[i] for i in range(len(files))]
    for d in sorted({p.parent for p in files} | {root}, key=lambda x: len(x.parts), reverse=True):
        fsync_dir(d)
    return {str(p.relative_to(root)): meta for p, meta in zip(files, sealed, strict=True)}


def write_manifest(
    ckpt: Path, step: int, extra: dict[str, Any] | None = None, files: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Write ``MANIFEST.json`` atomically, last: ``files`` as :func:`seal_tree` found them, or
    every file of ``ckpt`` hashed now when None.
    """
    if files is None:
        files = {
            str(p.relative_to(ckpt)): {"size": p.stat().st_size, "sha256": sha256_file(p)}
            for p in _files(ckpt)
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


class ManifestError(ValueError):
    """A MANIFEST.json that is missing, unreadable, malformed or names a file outside its checkpoint."""


@dataclass(frozen=True)
class Manifest:
    """A validated manifest: ``files`` maps each relative path to its ``size`` and ``sha256``."""

    data: dict[str, Any]
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def step(self) -> Any:
        return self.data.get("step")


@dataclass(frozen=True)
class Verdict:
    """The result of checking one checkpoint against its manifest.

    ``total_bytes`` is the size of the files the manifest lists (0 unless ``ok``);
    ``manifest`` is the validated manifest whenever it could be read, ``ok`` or not.
    """

    path: Path
    ok: bool
    reason: str = ""
    step: int | None = None
    total_bytes: int = 0
    manifest: Manifest | None = None


def inside(path: Path, root: Path) -> bool:
    """Whether ``path`` resolves (symlinks followed) to ``root`` or below it."""
    try:
        Path(os.path.realpath(path)).relative_to(os.path.realpath(root))
    except ValueError:
        return False
    return True


def check_member(ckpt: Path, rel: Any) -> Path:
    """``ckpt / rel`` if ``rel`` is a plain relative path that stays inside ``ckpt``.

    Raises:
        ManifestError: an empty, absolute, ``..`` or oddly written name, or one that a
            symlink leads out of the checkpoint.
    """
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise ManifestError(f"MANIFEST.json lists a file with no usable name ({rel!r})")
    if "\\" in rel or PureWindowsPath(rel).drive:
        raise ManifestError(f"MANIFEST.json names {rel!r}, not a plain relative path")
    parts = PurePosixPath(rel).parts
    if PurePosixPath(rel).is_absolute() or ".." in parts or not parts or parts == (".",):
        raise ManifestError(f"MANIFEST.json names {rel}, a path outside the checkpoint")
    path = ckpt / rel
    if not inside(path, ckpt):
        raise ManifestError(f"MANIFEST.json names {rel}, which leads outside the checkpoint (a symlink)")
    return path


def _entries(files: Any) -> dict[str, dict[str, Any]]:
    """``{rel: meta}`` from the dict shape steadytune writes or the ``[{"path", "size"}]`` list shape."""
    if isinstance(files, dict):
        items = list(files.items())
    elif isinstance(files, list):
        items = [(f.get("path"), f) if isinstance(f, dict) else (None, f) for f in files]
    else:
        raise ManifestError("MANIFEST.json is unreadable (no file list)")
    out: dict[str, dict[str, Any]] = {}
    for rel, meta in items:
        if not isinstance(meta, dict):
            raise ManifestError(f"MANIFEST.json is malformed: the entry of {rel!r} is not an object")
        out[rel] = {k: v for k, v in meta.items() if k != "path"}
    return out


def load_manifest(ckpt: Path) -> Manifest:
    """The manifest of ``ckpt``, validated: the one way to read a MANIFEST.json.

    Raises:
        ManifestError: the reason it cannot be used (the message says what is wrong).
    """
    ckpt = Path(ckpt)
    path = ckpt / MANIFEST
    if not path.exists():
        raise ManifestError("no MANIFEST.json (save did not finish)")
    if not inside(path, ckpt):
        raise ManifestError("MANIFEST.json leads outside the checkpoint (a symlink)")
    try:
        data = json.loads(read_text(path))
    except (ValueError, OSError, RecursionError):  # RecursionError: nested too deep to parse
        raise ManifestError("MANIFEST.json is unreadable") from None
    if not isinstance(data, dict):
        raise ManifestError("MANIFEST.json is unreadable (not an object)")
    files = _entries(data.get("files"))
    for rel in files:
        check_member(ckpt, rel)
    return Manifest(data, files)


def read_manifest(ckpt: Path) -> dict[str, Any] | None:
    """The validated manifest as a dict (``files`` in the ``{rel: meta}`` shape), or None."""
    try:
        m = load_manifest(ckpt)
    except ManifestError:
        return None
    return {**m.data, "files": m.files}


def verify(ckpt: Path, deep: bool = True) -> Verdict:
    """Check ``ckpt`` against its manifest: presence, sizes and (``deep``) sha256 of every file.

    ``deep=False`` checks sizes only: what the dashboard shows for every checkpoint of a
    run on each refresh, where hashing gigabytes would stall the page.

    Files present but not listed are tolerated (a reader may add caches); files
    listed but missing, short, long or changed are not, and neither is a manifest
    that names a path outside the checkpoint.
    """
    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        return Verdict(ckpt, False, "not a directory")
    try:
        manifest = load_manifest(ckpt)
    except ManifestError as exc:
        return Verdict(ckpt, False, str(exc))
    step = manifest.step

    def bad(reason: str) -> Verdict:
        return Verdict(ckpt, False, reason, step, manifest=manifest)

    if not manifest.files:
        return bad("MANIFEST.json lists no files")
    total = 0
    for rel, meta in manifest.files.items():
        p = ckpt / rel
        if not p.is_file():
            return bad(f"{rel} is missing")
        size = p.stat().st_size
        if size != meta.get("size"):
            return bad(f"{rel} has {size} bytes, manifest says {meta.get('size')} (truncated?)")
        if deep and sha256_file(p) != meta.get("sha256"):
            return bad(f"{rel} sha256 mismatch (corrupted)")
        total += size
    return Verdict(ckpt, True, "", step, total, manifest)


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

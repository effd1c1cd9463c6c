"""Publishing checkpoints: staging → verified place, pointers, retention, disk checks.

The write protocol (DESIGN.md): the trainer writes into ``checkpoints/.staging``;
we fsync and hash it in one pass, rename it to ``checkpoints/checkpoint-<step>``, then
write ``MANIFEST.json`` (the hashes taken before the rename) last. A crash at any point leaves either no
directory, or one
without a manifest, which readers ignore.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from steadytune.checkpoint.manifest import checkpoint_step, list_checkpoints, seal_tree, write_manifest
from steadytune.regularfile import read_text
from steadytune.rundir import atomic_write_text, fsync_dir


class DiskFullError(OSError):
    """Not enough free disk to save a checkpoint safely."""


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def ensure_free_space(path: Path, needed: int, free: Callable[[Path], int] = free_bytes) -> None:
    """Raise :class:`DiskFullError` when less than ``needed`` bytes are free at ``path``."""
    have = free(path)
    if have < needed:
        raise DiskFullError(
            f"only {have / 1024**2:.0f} MiB free under {path}, need {needed / 1024**2:.0f} MiB for a "
            f"checkpoint; "
            "free disk space or lower run.keep_last"
        )


def write_pointer(pointer: Path, target: Path | str) -> None:
    """Point ``LATEST``/``LAST_GOOD`` at a checkpoint name, atomically."""
    atomic_write_text(pointer, Path(target).name + "\n")


def pointer_name(pointer: Path) -> str | None:
    """The checkpoint name a pointer holds, whether or not that folder still exists.

    None for a missing pointer or one that names no plain sibling (empty, a path, hidden).
    The dashboard shows a pointer to a folder retention or a person removed; resume uses
    :func:`read_pointer`, which also wants the folder.
    """
    try:
        name = read_text(pointer).strip()
    except OSError:
        return None
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    return name


def read_pointer(pointer: Path) -> Path | None:
    """The checkpoint a pointer names, if the pointer exists and the directory does too."""
    name = pointer_name(pointer)
    if name is None:
        return None
    target = pointer.parent / name
    return target if target.is_dir() else None


def publish(
    staged: Path,
    root: Path,
    step: int,
    extra: dict[str, Any] | None = None,
    before_manifest: Callable[[Path], None] | None = None,
) -> Path:
    """Move a fully written staging directory into place and seal it with its manifest.

    ``before_manifest`` is a test hook: it runs after the rename and before the
    manifest, the window in which a crash must leave an unusable checkpoint.
    """
    final = root / f"checkpoint-{step}"
    # One pass: every file is made durable and hashed before the rename, so the manifest
    # needs no second read; the rename moves the same bytes.
    files = seal_tree(staged)
    if final.exists():
        # A previous attempt died after the rename but before the manifest: replace it.
        shutil.rmtree(final)
    os.replace(staged, final)
    fsync_dir(root)
    if before_manifest is not None:
        before_manifest(final)
    write_manifest(final, step, extra, files=files)
    return final


def apply_retention(root: Path, keep_last: int, protect: set[Path] | None = None) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints, never one in ``protect``. Returns the deleted."""
    protect_names = {p.name for p in (protect or set()) if p is not None}
    deleted = []
    for ckpt in list_checkpoints(root)[keep_last:]:
        if ckpt.name in protect_names:
            continue
        shutil.rmtree(ckpt, ignore_errors=True)
        deleted.append(ckpt)
    return deleted


def clean_staging(staging: Path) -> None:
    """Remove leftovers of a save that a crash interrupted."""
    if staging.exists():
        shutil.rmtree(staging, ignore_errors=True)


def steps_of(root: Path) -> list[int]:
    return sorted(s for p in list_checkpoints(root) if (s := checkpoint_step(p)) is not None)

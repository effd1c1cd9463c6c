"""Disk a running job still needs: its checkpoints to come and the data cache, for disk_low.

The disk_low detector (:mod:`steadytune.detect.system`) judges free space against a
share of the disk; a run whose next checkpoints do not fit should raise it earlier, while
there is still time to act. :func:`projected_need` is the pure rule;
:func:`run_disk_need` reads a run directory to feed it; the supervisor calls it after
every saved checkpoint and hands the answer to the detector (torch-free, a few ``stat`` calls).
"""

from __future__ import annotations

from pathlib import Path


def projected_need(
    checkpoint_bytes: int, saves_remaining: int, keep_last: int, existing: int, final_bytes: int = 0
) -> int:
    """Bytes the run will still add to its disk at the worst moment.

    Retention keeps ``keep_last`` checkpoints plus LAST_GOOD, and a new checkpoint is
    complete before the oldest is removed, so at most ``keep_last + 2`` exist at once.

    Args:
        checkpoint_bytes: the size of one checkpoint.
        saves_remaining: checkpoints the run will still write.
        keep_last: ``run.keep_last``.
        existing: checkpoints on disk now.
        final_bytes: the final model written at the end (0 when already written).
    """
    if saves_remaining <= 0:
        return final_bytes
    peak = min(existing + saves_remaining, keep_last + 2)
    return max(0, peak - existing) * checkpoint_bytes + final_bytes


def folder_bytes(path: Path) -> int:
    total = 0
    for f in path.rglob("*"):
        try:
            if f.is_file():
                total += f.stat().st_size
        except OSError:
            continue
    return total


def run_disk_need(
    checkpoints_dir: Path,
    keep_last: int,
    save_steps: int,
    max_steps: int | None,
    step: int,
    estimated_checkpoint_bytes: int | None = None,
) -> int | None:
    """What :func:`projected_need` says for a live run directory.

    The checkpoint size is the newest checkpoint's on disk, or the estimate before the first
    one exists. None when neither is known or the run length is unknown.
    """
    found = sorted(
        (p for p in checkpoints_dir.glob("checkpoint-*") if p.is_dir()),
        key=lambda p: int(p.name.rsplit("-", 1)[-1]) if p.name.rsplit("-", 1)[-1].isdigit() else -1,
    )
    size = folder_bytes(found[-1]) if found else estimated_checkpoint_bytes
    if size is None or not max_steps or max_steps < 0 or save_steps <= 0:
        return None
    remaining = max(0, (max_steps - step) // save_steps)
    return projected_need(size, remaining, keep_last, len(found))

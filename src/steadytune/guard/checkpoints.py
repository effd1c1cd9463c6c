"""The worker's side of checkpointing: disk check before, publish + pointers + retention after.

The trainer writes a checkpoint into the staging folder; :meth:`CheckpointKeeper.publish`
turns it into a verified checkpoint (see :mod:`steadytune.checkpoint.store`).
Only rank 0 publishes; other ranks only wait at the barrier the adapter holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from steadytune.checkpoint.manifest import list_checkpoints
from steadytune.checkpoint.store import (
    DiskFullError,
    apply_retention,
    ensure_free_space,
    publish,
    read_pointer,
    write_pointer,
)
from steadytune.rundir import RunDir


class CheckpointKeeper:
    def __init__(
        self,
        run: RunDir,
        keep_last: int = 3,
        min_free_bytes: int = 256 * 1024**2,
        save_delay: Callable[[int], float] | None = None,
    ) -> None:
        self.run = run
        self.keep_last = keep_last
        self.min_free_bytes = min_free_bytes
        # A test hook for drills: makes the unsafe window of a save long enough to kill in.
        self.save_delay = save_delay or (lambda step: 0.0)

    def needed_bytes(self) -> int:
        """Free space a new checkpoint needs: the last one's size (or the floor) plus the floor."""
        newest = list_checkpoints(self.run.checkpoints)
        last = 0
        if newest:
            last = sum(p.stat().st_size for p in newest[0].rglob("*") if p.is_file())
        return last + self.min_free_bytes

    def check_disk(self) -> str | None:
        """None when a save may go ahead, else the reason it must not."""
        try:
            ensure_free_space(self.run.root, self.needed_bytes())
        except DiskFullError as exc:
            return str(exc)
        return None

    def publish(
        self,
        staged: Path,
        step: int,
        extra: dict | None = None,
        before_manifest: Callable[[Path], None] | None = None,
    ) -> Path:
        hook = before_manifest
        delay = self.save_delay(step)
        if delay > 0:

            def hook(path: Path, _inner: Callable[[Path], None] | None = before_manifest) -> None:
                time.sleep(delay)
                if _inner:
                    _inner(path)

        final = publish(staged, self.run.checkpoints, step, extra, before_manifest=hook)
        write_pointer(self.run.latest_pointer, final)
        protect = {p for p in (read_pointer(self.run.last_good_pointer), final) if p is not None}
        apply_retention(self.run.checkpoints, self.keep_last, protect=protect)
        return final

"""The worker's side of checkpointing: disk check before, publish + pointers + retention after.

The trainer writes a checkpoint into the staging folder; :meth:`CheckpointKeeper.publish`
turns it into a verified checkpoint (see :mod:`steadytune.checkpoint.store`).
Only rank 0 publishes; other ranks only wait at the barrier the adapter holds.
"""

from __future__ import annotations

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
        save_fault: Callable[[int], None] | None = None,
    ) -> None:
        self.run = run
        self.keep_last = keep_last
        self.min_free_bytes = min_free_bytes
        # A hook for drills and tests, run in the unsafe window of step N's save (after the rename, before
        # the manifest): it holds the save there long enough to kill in, or makes it fail.
        self.save_fault = save_fault

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
        fault = self.save_fault
        if fault is not None:

            def hook(path: Path, _inner: Callable[[Path], None] | None = before_manifest) -> None:
                fault(step)
                if _inner:
                    _inner(path)

        final = publish(staged, self.run.checkpoints, step, extra, before_manifest=hook)
        write_pointer(self.run.latest_pointer, final)
        protect = {p for p in (read_pointer(self.run.last_good_pointer), final) if p is not None}
        apply_retention(self.run.checkpoints, self.keep_last, protect=protect)
        return final

"""Worker-side CUDA memory snapshot, for ``mem-profile`` and on-demand debugging.

``dump_cuda_snapshot(path)`` writes what the caching allocator holds, block by
block with the stack that allocated it, in the pickle format that
https://pytorch.org/memory_viz reads. Allocation stacks exist only after
``start_recording()`` (PyTorch records them from then on, at some cost per
allocation), so call that early in a run you mean to inspect.

On a machine without CUDA both functions are no-ops that say so: a profile of a
CPU run has nothing for them to add.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SnapshotResult:
    written: bool
    path: Path | None
    message: str


def _cuda() -> object | None:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def start_recording(max_entries: int = 100_000) -> bool:
    """Start recording allocation stacks (True), or say no CUDA is there (False)."""
    torch = _cuda()
    if torch is None:
        return False
    torch.cuda.memory._record_memory_history(max_entries=max_entries)  # type: ignore[attr-defined]
    return True


def dump_cuda_snapshot(path: str | Path) -> SnapshotResult:
    """Write the CUDA caching allocator's snapshot to ``path`` (a ``.pickle`` for memory_viz).

    Returns a :class:`SnapshotResult`; on CPU nothing is written and the message says why.
    """
    torch = _cuda()
    if torch is None:
        return SnapshotResult(
            False,
            None,
            "no CUDA device in this process: a CUDA memory snapshot needs a GPU run "
            "(RSS/USS from mem-profile cover CPU memory)",
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    snapshot = torch.cuda.memory._snapshot()  # type: ignore[attr-defined]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(snapshot, f)
    tmp.replace(path)
    segments = len(snapshot.get("segments", []))
    reserved = sum(s.get("total_size", 0) for s in snapshot.get("segments", []))
    return SnapshotResult(
        True,
        path,
        f"wrote {path} ({segments} segments, {reserved / 1024**2:.0f} MiB reserved); "
        "open it at https://pytorch.org/memory_viz",
    )

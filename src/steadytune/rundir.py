"""The run directory: the contract between the parts (see DESIGN.md).

Every path of a run is named here, once. Nothing else builds these paths by hand.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# A stream passing this size is sealed into a segment (rank-0.00001.jsonl.gz) and written on in a
# fresh live file; the least keeps a rotation from happening every few steps.
DEFAULT_SEGMENT_BYTES = 64 << 20
MIN_SEGMENT_BYTES = 16 << 10
RANK_FILE_RE = re.compile(r"^rank-(\d+)\.jsonl$")  # a live stream; not rank-0.00001.jsonl(.gz), a segment
# The states status.json ends in: a supervisor that wrote one of these has ended. Any other state
# left behind by a supervisor that is gone was its last before it was killed.
ENDED_STATES = frozenset({"completed", "failed", "stopped"})


def valid_run_id(run_id: str) -> bool:
    """A run id is a plain name: no separators, no ``..``, nothing a path could escape with."""
    return bool(RUN_ID_RE.match(run_id)) and ".." not in run_id


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory, ``runs/<run-id>/``."""

    root: Path

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def env(self) -> Path:
        """The environment the run started in (Python, packages, torch/CUDA, GPUs, git)."""
        return self.root / "env.json"

    @property
    def plan(self) -> Path:
        return self.root / "plan.jsonl"

    @property
    def telemetry_dir(self) -> Path:
        return self.root / "telemetry"

    def telemetry(self, rank: int) -> Path:
        return self.telemetry_dir / f"rank-{rank}.jsonl"

    def telemetry_files(self) -> list[Path]:
        """The live file of each rank's stream, by rank (its sealed segments are the readers' to find)."""
        if not self.telemetry_dir.is_dir():
            return []
        ranks = [
            (int(m.group(1)), p) for p in self.telemetry_dir.iterdir() if (m := RANK_FILE_RE.match(p.name))
        ]
        return [p for _, p in sorted(ranks)]

    @property
    def system(self) -> Path:
        return self.root / "system.jsonl"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def db(self) -> Path:
        return self.root / "run.db"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def staging(self) -> Path:
        """Where checkpoints are written before they are verified and moved in place."""
        return self.checkpoints / ".staging"

    @property
    def latest_pointer(self) -> Path:
        return self.checkpoints / "LATEST"

    @property
    def last_good_pointer(self) -> Path:
        return self.checkpoints / "LAST_GOOD"

    @property
    def repro(self) -> Path:
        return self.root / "repro"

    @property
    def control(self) -> Path:
        """The queue of operator and supervisor requests to the worker: one JSON file each."""
        return self.root / "control"

    @property
    def status(self) -> Path:
        """The supervisor's current view of the run, for `top`, the dashboard and the CLI."""
        return self.root / "status.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def stacks(self) -> Path:
        return self.root / "stacks"

    def create(self) -> RunDir:
        for p in (self.root, self.telemetry_dir, self.checkpoints, self.logs):
            p.mkdir(parents=True, exist_ok=True)
        return self


def looks_like_run(path: Path) -> bool:
    """Whether ``path`` is a run directory: a folder holding one of the files every run writes."""
    return path.is_dir() and any(
        (path / name).exists() for name in ("status.json", "telemetry", "events.jsonl", "run.db")
    )


def fsync_dir(path: Path) -> None:
    """Make a rename or create inside ``path`` durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str, durable: bool = True) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never half.

    ``durable``: on disk before this returns (the file and the rename, each fsync'd). A file
    rewritten every second for its readers (``status.json``) passes False: a crash of the
    machine costs it at most its last seconds, and two fsyncs a second for a week-long run
    are a steady load on the run's disk for nothing.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)


def file_stamp(path: Path) -> tuple[int, int] | None:
    """``(mtime in ns, size)`` of ``path``; None when it is not there."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size

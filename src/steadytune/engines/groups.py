"""Which attempt a Ray worker group trains, and from where: decided by rank 0 when the group starts.

Ray restarts the worker group on its own, after a node is lost or to resize an elastic run,
inside one attempt of the supervisor (one driver process). Each group is therefore an attempt
of its own in the run's streams: its records carry a fresh attempt number, so the supervisor
tells the new timeline from the old one, and it resumes from the newest verified checkpoint
this driver's groups wrote (never from one of a timeline a rollback left behind).

Pure and torch-free: the list of earlier groups and the checkpoints come in, a decision comes out.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from steadytune.checkpoint.manifest import MANIFEST, list_checkpoints, verify
from steadytune.telemetry.jsonl import JsonlReader

START, RESIZE, RESTART = "ray_start", "ray_resize", "ray_restart"


@dataclass(frozen=True)
class Group:
    """One worker group of a driver: the attempt it trains, its size, what it resumes from, and why."""

    group: int
    attempt: int
    world_size: int
    reason: str
    resume_checkpoint: str | None
    previous_world_size: int | None = None
    nodes: int | None = None
    gradient_accumulation_steps: int | None = None  # set where the effective batch is kept (accumulation_for)


def next_group(
    earlier: list[Group],
    base_attempt: int,
    base_resume: str | None,
    world_size: int,
    newest_own: str | None,
    nodes: int | None = None,
) -> Group:
    """The group that starts now, after ``earlier`` ones of the same driver.

    ``base_attempt``/``base_resume`` are the supervisor's plan for this driver; ``newest_own`` is
    the newest verified checkpoint a group of this driver saved.
    """
    if not earlier:
        return Group(0, base_attempt, world_size, START, base_resume, None, nodes)
    last = earlier[-1]
    # Ray grows an elastic group only when room appears; it shrinks one only after losing workers.
    reason = RESIZE if world_size > last.world_size else RESTART
    return Group(
        last.group + 1,
        last.attempt + 1,
        world_size,
        reason,
        newest_own or base_resume,
        last.world_size,
        nodes,
    )


def accumulation_for(accum: int, at_world_size: int, world_size: int) -> tuple[int, bool]:
    """The accumulation that keeps ``accum × at_world_size`` micro-batches per optimizer step on
    ``world_size``.

    Exact when it divides; else the nearest (at least 1), and False says the effective batch changed.
    """
    total = accum * at_world_size
    if total % world_size == 0:
        return total // world_size, True
    return max(1, round(total / world_size)), False


def newest_own_checkpoint(root: Path, first_attempt: int) -> str | None:
    """The newest checkpoint under ``root`` that verifies and was saved at ``first_attempt`` or later."""
    for ckpt in list_checkpoints(root):
        try:
            saved_by = json.loads((ckpt / MANIFEST).read_text(encoding="utf-8")).get("attempt")
        except (OSError, ValueError):
            continue
        if isinstance(saved_by, int) and saved_by >= first_attempt and verify(ckpt).ok:
            return str(ckpt)
    return None


def failures_path(run_root: Path, attempt: int) -> Path:
    """Where Ray's controller records each failed group of the driver of ``attempt`` (ray_callback.py)."""
    return run_root / "ray" / f"attempt-{attempt}-failures.jsonl"


class GroupLog:
    """``ray/attempt-<A>.jsonl``: the groups one driver started, appended by each group's rank 0."""

    def __init__(self, run_root: Path, base_attempt: int) -> None:
        self.path = run_root / "ray" / f"attempt-{base_attempt}.jsonl"

    def read(self) -> list[Group]:
        out = []
        # final: the log is read whole, so a last line without its newline is still a line.
        for row in JsonlReader(self.path).dicts(final=True):
            try:
                out.append(Group(**row))
            except TypeError:
                continue  # a line cut short by a node that died mid-write, or not a group's
        return out

    def append(self, group: Group) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = self.path.exists() and not self.path.read_bytes().endswith(b"\n") and self.path.stat().st_size
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(("\n" if torn else "") + json.dumps(asdict(group)) + "\n")

    @staticmethod
    def as_event_data(group: Group) -> dict[str, Any]:
        return {k: v for k, v in asdict(group).items() if v is not None}

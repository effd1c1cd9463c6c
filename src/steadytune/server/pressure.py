"""Memory pressure: which job to pause (or shrink) before a GPU runs out, and when it may resume.

Pure: the ledger and the running jobs go in, actions come out. No clock, no I/O.

A GPU is *under pressure* when its free memory falls below ``threshold_bytes`` (by
default the admission headroom, 1 GiB): a job on it that allocates more now would run
out of memory, and on a shared GPU the one that fails is whichever asks next, not
necessarily the one that grew. So the lowest-priority job on that GPU (the latest
started among equals) steps aside before anyone fails: it is shrunk off that GPU when
its ``scale:`` lets it run on fewer, and otherwise checkpointed and paused. A job alone on
a GPU with nothing foreign beside it is left alone: the pressure is its own, and pausing
it would only make it hit the same wall at its resume.

A job paused for pressure keeps its reservation, so the queue cannot take its room;
it resumes once its GPUs have its need free again, beyond everyone else's reservations
and the headroom. That bar is higher than the one that paused it, so a job does not
flap between paused and running on one reading.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from steadytune.server.admission import gib
from steadytune.server.ledger import GpuState


@dataclass(frozen=True)
class LiveJob:
    """A running job as the pressure rule sees it."""

    job_id: str
    priority: int
    seq: int
    gpus: tuple[int, ...]
    need_bytes: int
    paused: bool = False  # paused by the server for pressure (its worker has stopped or is stopping)
    min_gpus: int | None = None  # its ``scale: min_gpus``; None when it cannot change size
    stepping_aside: bool = False  # a shrink or a pause was asked for and has not taken effect yet


@dataclass(frozen=True)
class PressureAction:
    kind: str  # pause / shrink / resume
    job_id: str
    gpu: int | None  # the device under pressure (None for a resume)
    reason: str
    keep: tuple[int, ...] = ()  # shrink: the GPUs the job keeps


def victim(gpu: GpuState, jobs: Sequence[LiveJob]) -> LiveJob | None:
    """The job that steps aside on ``gpu``: the lowest priority, the latest started among equals.

    None while a job on it is still stepping aside (saving its checkpoint, shrinking): what
    that frees is not in the readings yet, and asking a second job now would be one too many.
    """
    if any(gpu.index in j.gpus and j.stepping_aside for j in jobs):
        return None
    here = [j for j in jobs if gpu.index in j.gpus and not j.paused]
    if not here:
        return None
    others = len([j for j in jobs if gpu.index in j.gpus and not j.paused]) > 1
    if not others and not gpu.foreign:
        return None  # alone on it: the pressure is its own
    return min(here, key=lambda j: (j.priority, -j.seq))


def relieve(
    gpus: Sequence[GpuState], jobs: Sequence[LiveJob], threshold_bytes: int, headroom_bytes: int
) -> list[PressureAction]:
    """One pass: at most one job steps aside per GPU under pressure; paused jobs with room resume.

    Args:
        gpus: the ledger now.
        jobs: the running jobs (paused ones included).
        threshold_bytes: a GPU with less free than this is under pressure.
        headroom_bytes: the admission headroom, which a resume must leave as well.
    """
    out: list[PressureAction] = []
    acted: set[str] = set()
    for g in gpus:
        if g.free_bytes >= threshold_bytes:
            continue
        v = victim(g, jobs)
        if v is None or v.job_id in acted:
            continue
        acted.add(v.job_id)
        why = f"GPU {g.index} has {gib(g.free_bytes)} free < {gib(threshold_bytes)}"
        if v.min_gpus is not None and len(v.gpus) > v.min_gpus:
            keep = tuple(i for i in v.gpus if i != g.index)
            out.append(
                PressureAction(
                    "shrink", v.job_id, g.index,
                    f"{why}: {v.job_id} (priority {v.priority}) shrinks off it, "
                    f"{len(v.gpus)} -> {len(keep)} GPUs (scale.min_gpus {v.min_gpus})",
                    keep,
                )
            )  # fmt: skip
        else:
            out.append(
                PressureAction(
                    "pause", v.job_id, g.index,
                    f"{why}: {v.job_id} (priority {v.priority}) is checkpointed and paused until it has room",
                )
            )  # fmt: skip
    by_index = {g.index: g for g in gpus}
    for j in jobs:
        if not j.paused or j.stepping_aside or j.job_id in acted:
            continue
        rooms = []
        for i in j.gpus:
            on = by_index.get(i)
            if on is None:
                break
            # Its own reservation is all outstanding while it is paused: the room is what is left without it.
            own = j.need_bytes if j.job_id in on.jobs else 0
            rooms.append((i, on.free_bytes - (on.reserved_bytes - own) - headroom_bytes))
        if len(rooms) == len(j.gpus) and all(room >= j.need_bytes for _, room in rooms):
            where = ", ".join(f"GPU {i} {gib(max(0, r))}" for i, r in rooms)
            out.append(
                PressureAction(
                    "resume", j.job_id, None,
                    f"room returned for {j.job_id}: needs {gib(j.need_bytes)}; "
                    f"free − reserved − headroom is {where}",
                )
            )  # fmt: skip
    return out

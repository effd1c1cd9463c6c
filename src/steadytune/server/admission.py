"""Memory-aware admission: which waiting jobs start now, where, and why the others wait.

Pure: the ledger and the waiting jobs go in, one :class:`Decision` per job comes out.

A job that needs N bytes per device on k GPUs is admitted only on k devices where
free − reserved − headroom ≥ N. Jobs are considered in priority order (higher first),
first come first served within a priority. A job that has to wait for room holds the
line: the jobs behind it wait too, so a stream of small jobs cannot starve a large
one. A job that could never fit here (more GPUs than the host has, or a need larger
than a device holds) does not hold the line; it waits with that reason until it is
cancelled or resubmitted smaller.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from steadytune.server.ledger import GIB, GpuState

DEFAULT_HEADROOM_BYTES = GIB  # the brief's "keep at least 1 GB spare", per device


@dataclass(frozen=True)
class JobRequest:
    """A waiting job as admission sees it."""

    job_id: str
    need_bytes: int  # peak per device
    gpus: int = 1
    priority: int = 0
    seq: int = 0  # submission order


@dataclass(frozen=True)
class Decision:
    job_id: str
    admitted: bool
    gpus: tuple[int, ...]
    reason: str


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def order(jobs: Iterable[JobRequest]) -> list[JobRequest]:
    """Priority first (higher first), then submission order."""
    return sorted(jobs, key=lambda j: (-j.priority, j.seq))


def never_fits(job: JobRequest, gpus: Sequence[GpuState], headroom_bytes: int) -> str | None:
    """Why ``job`` cannot fit here even on an empty host, or None."""
    if job.gpus > len(gpus):
        return (
            f"needs {job.gpus} GPUs; this server manages {len(gpus)}: submit it again with --gpus "
            f"{len(gpus)} or fewer (a config job: run.nproc_per_node={len(gpus)} or fewer, with sharding "
            "where one GPU's share does not fit)"
        )
    roomy = [g for g in gpus if g.total_bytes - headroom_bytes >= job.need_bytes]
    if len(roomy) < job.gpus:
        biggest = max((g.total_bytes for g in gpus), default=0)
        return (
            f"needs {gib(job.need_bytes)} per GPU + {gib(headroom_bytes)} headroom; the largest GPU "
            f"holds {gib(biggest)}: lower the micro-batch or sequence length, or use more GPUs with sharding "
            "(a need given by hand: a smaller --need-gib)"
        )
    return None


def place(job: JobRequest, available: dict[int, int]) -> tuple[int, ...] | None:
    """The k devices with the most room that each fit the need, or None.

    The roomiest devices first: jobs that share a GPU share its compute, so spreading
    keeps each one as fast as it can be.
    """
    fits = sorted(
        (i for i, room in available.items() if room >= job.need_bytes), key=lambda i: (-available[i], i)
    )
    if len(fits) < job.gpus:
        return None
    return tuple(sorted(fits[: job.gpus]))


def _wait_reason(job: JobRequest, available: dict[int, int], headroom_bytes: int) -> str:
    best = sorted(available.values(), reverse=True)[: job.gpus]
    room = ", ".join(gib(b) for b in best) or "none"
    return (
        f"waits for room: needs {gib(job.need_bytes)} on {job.gpus} GPU(s); "
        f"free − reserved − {gib(headroom_bytes)} headroom is {room} on the roomiest"
    )


def admit(
    waiting: Iterable[JobRequest], gpus: Sequence[GpuState], headroom_bytes: int = DEFAULT_HEADROOM_BYTES
) -> list[Decision]:
    """Decide every waiting job, in the order they are considered.

    Each admitted job's need is taken off the devices it got before the next job is
    considered, so one pass never promises the same bytes twice.
    """
    available = {g.index: g.available(headroom_bytes) for g in gpus}
    decisions: list[Decision] = []
    blocker: JobRequest | None = None
    # Whether a shape can ever fit depends on the shape alone: a queue of a thousand jobs holds few.
    impossible_for: dict[tuple[int, int], str | None] = {}
    for job in order(waiting):
        shape = (job.need_bytes, job.gpus)
        if shape not in impossible_for:
            impossible_for[shape] = never_fits(job, gpus, headroom_bytes)
        impossible = impossible_for[shape]
        if impossible is not None:
            decisions.append(Decision(job.job_id, False, (), f"never fits here: {impossible}"))
            continue
        if blocker is not None:
            decisions.append(
                Decision(
                    job.job_id, False, (), f"waits behind {blocker.job_id} (priority {blocker.priority})"
                )
            )
            continue
        chosen = place(job, available)
        if chosen is None:
            decisions.append(Decision(job.job_id, False, (), _wait_reason(job, available, headroom_bytes)))
            blocker = job
            continue
        for i in chosen:
            available[i] -= job.need_bytes
        where = ", ".join(str(i) for i in chosen)
        decisions.append(Decision(job.job_id, True, chosen, f"fits on GPU {where}"))
    return decisions


def start_everything(
    jobs: Iterable[JobRequest], gpus: Sequence[GpuState], actual_peak: dict[str, int]
) -> dict[str, bool]:
    """The estimator-free baseline: start every job at once, first come first served, on
    the least-loaded devices; True for each job whose device would have run out of memory.

    ``actual_peak`` is what each job really takes per device.
    """
    used = {g.index: g.used_bytes for g in gpus}
    total = {g.index: g.total_bytes for g in gpus}
    load = {g.index: 0 for g in gpus}
    placed: dict[str, tuple[int, ...]] = {}
    for job in sorted(jobs, key=lambda j: j.seq):
        chosen = sorted(load, key=lambda i: (load[i], i))[: job.gpus]
        for i in chosen:
            load[i] += 1
            used[i] += actual_peak[job.job_id]
        placed[job.job_id] = tuple(chosen)
    over = {i for i in used if used[i] > total[i]}
    return {jid: any(i in over for i in where) for jid, where in placed.items()}

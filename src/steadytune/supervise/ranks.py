"""Which rank a process of a multi-rank job is, and which rank a fault was on.

A launcher (torchrun, ``accelerate launch``) sets ``RANK`` and ``LOCAL_RANK`` in each worker's
environment, so ``/proc/<pid>/environ`` names the rank of every process of the job; the launcher
itself has none. ``/proc/<pid>/stat`` says whether a process is stopped (SIGSTOP, a debugger):
in a hang, that rank is the one the others wait for in their collective. When a worker dies,
torch elastic's error report (its ``Root Cause`` block, in the job's output) names the rank, its
pid and its exit code. The readers take the ``/proc`` root, so tests give them a fake tree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class RankProc:
    """One process of the job as its stacks are asked for: its rank, if it is a worker."""

    pid: int
    rank: int | None = None
    local_rank: int | None = None
    stopped: bool = False  # stopped (SIGSTOP) when it was looked at: it could not have stepped

    def label(self) -> str:
        """``pid 9531, rank 1 (local rank 1), was stopped``: how its stack dump is headed."""
        words = [f"pid {self.pid}"]
        if self.rank is not None:
            local = f" (local rank {self.local_rank})" if self.local_rank is not None else ""
            words.append(f"rank {self.rank}{local}")
        else:
            words.append("no rank (a launcher or a helper process)")
        if self.stopped:
            words.append("was stopped (SIGSTOP)")
        return ", ".join(words)


def env_ranks(environ: bytes) -> tuple[int | None, int | None]:
    """``RANK`` and ``LOCAL_RANK`` of a ``/proc/<pid>/environ`` (NUL-separated ``KEY=value``)."""
    found: dict[str, int] = {}
    for item in environ.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"RANK", b"LOCAL_RANK"):
            try:
                found[key.decode()] = int(value)
            except ValueError:
                continue
    return found.get("RANK"), found.get("LOCAL_RANK")


def stat_stopped(stat: str) -> bool:
    """Whether ``/proc/<pid>/stat`` says stopped: its state (after the ``)`` that ends the name) is T."""
    state = stat.rpartition(")")[2].split()
    return bool(state) and state[0] in {"T", "t"}


def read_proc(pid: int, proc: Path = PROC) -> RankProc:
    """The rank and run state of ``pid``, as far as ``proc`` tells (a process gone: no rank)."""
    try:
        rank, local = env_ranks((proc / str(pid) / "environ").read_bytes())
    except OSError:
        rank, local = None, None
    try:
        stopped = stat_stopped((proc / str(pid) / "stat").read_text())
    except OSError:
        stopped = False
    return RankProc(pid, rank, local, stopped)


def hung_ranks(procs: Iterable[RankProc], silent_s: Mapping[int, float] | None = None) -> str:
    """Which rank a hang is on, in words; ``""`` when nothing tells the ranks apart.

    A stopped worker is the hung one: the others wait for it in a collective. Else, with more
    than one rank heard from, how long each has been silent (``silent_s``: rank -> seconds), the
    longest first: the facts, not a guess.
    """
    workers = sorted((p for p in procs if p.rank is not None), key=lambda p: p.rank or 0)
    stopped = [p for p in workers if p.stopped]
    if stopped:
        names = ", ".join(f"rank {p.rank} (pid {p.pid})" for p in stopped)
        verb = "was" if len(stopped) == 1 else "were"
        return f"{names} {verb} stopped (SIGSTOP): the other ranks wait for it"
    if silent_s and len(silent_s) > 1:
        order = sorted(silent_s.items(), key=lambda kv: -kv[1])
        return "silent " + ", ".join(f"rank {r} for {s:.0f}s" for r, s in order)
    return ""


# torch elastic's ChildFailedError report: each failure's block has its rank and, on the exit code's
# line, the pid (`rank : 1 (local_rank: 1)` ... `exitcode : -9 (pid: 9531)`). The Root Cause is the
# first failure observed.
_ROOT = "Root Cause (first observed failure):"
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)(?:\s*\(local_rank:\s*(\d+)\))?", re.M)
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)", re.M)


def failed_rank(tail: str) -> str | None:
    """The rank a multi-rank job lost first, from torch elastic's report in its output's tail:
    ``rank 1 (local rank 1, pid 9531)``; None when the tail holds no such report."""
    at = tail.rfind(_ROOT)  # the last report: a tail may hold an earlier attempt's too
    if at < 0:
        return None
    root = tail[at:]
    rank, exit_ = _RANK.search(root), _EXIT.search(root)
    if rank is None:
        return None
    extra = [f"local rank {rank.group(2)}"] if rank.group(2) is not None else []
    if exit_ is not None:
        extra.append(f"pid {exit_.group(2)}")
    return f"rank {rank.group(1)}" + (f" ({', '.join(extra)})" if extra else "")

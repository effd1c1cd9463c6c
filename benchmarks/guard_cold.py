"""Why the guard's step costs more inside the training loop than called back to back.

    python benchmarks/guard_cold.py [--reps 300] [--dir RUN_DIR_PARENT]

Each part of ``Guard.end_step`` is timed, interleaved in a shuffled order, two ways:
right after a compute workload the size of the demo's step (a matmul and its backward
on one thread, which sweeps a few MB through the CPU's caches), and back to back (the
same call just made). Parts: the step record's ``write(2)`` (O_APPEND, as JsonlWriter
does) on the run directory's filesystem and on tmpfs (/dev/shm), a ``pwrite`` into a
pre-allocated file on each (no size or extent change per write), a second write right
after the first, a cheap system call before the write, ``StepRecord(...)``,
``to_json``, ``device_memory_stats()``, the clock, and the whole ``Guard.end_step``.
Figures are min / median / p90 in µs over ``--reps``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from steadytune.guard.core import Guard, device_memory_stats
from steadytune.records import StepRecord, to_json

FIELDS = dict(step=12, ts=1764615600.123456, loss=2.3456789, grad_norm=1.234567, lr=4.9e-05, tokens=512,
              samples=8, step_time_s=0.0081234, epoch=0.06, rss_bytes=812345344)  # fmt: skip
LINE = (to_json(StepRecord(**FIELDS)) + "\n").encode()


def files(parent: Path, label: str) -> dict[str, Callable[[], object]]:
    """The record's write on one filesystem: appended, and written in place into a pre-allocated file."""
    folder = Path(tempfile.mkdtemp(dir=parent))
    append = os.open(folder / "append.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    placed = os.open(folder / "placed.jsonl", os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(placed, 0, 64 << 20)
    offset = [0]

    def pwrite() -> None:
        offset[0] += os.pwrite(placed, LINE, offset[0])

    def twice() -> None:
        os.write(append, LINE)

    return {
        f"write {label}": lambda: os.write(append, LINE),
        f"pwrite pre-allocated {label}": pwrite,
        f"2nd write right after {label}": twice,  # preceded by a first write below
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--dir", type=Path, default=Path.cwd(), help="where the run-directory files go")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir) as here, tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        measure(a.reps, Path(here), Path(shm))


def measure(reps: int, here: Path, shm: Path) -> None:
    torch.set_num_threads(1)
    x, w = torch.randn(256, 1024), torch.randn(1024, 1024, requires_grad=True)

    def compute() -> None:
        for _ in range(3):
            (x @ w).square().sum().backward()

    guard = Guard(here / "run", rank=0, attempt=0)
    step = [0]

    def end_step() -> None:
        step[0] += 1
        guard.end_step(step[0], loss=2.5, lr=1e-4, epoch=0.1)

    record = StepRecord(**FIELDS)
    parts: dict[str, Callable[[], object]] = {
        **files(here, "run dir"),
        **files(shm, "tmpfs"),
        "getppid()": os.getppid,
        "StepRecord(...)": lambda: StepRecord(**FIELDS),
        "to_json(record)": lambda: to_json(record),
        "device_memory_stats()": device_memory_stats,
        "time.time()": time.time,
        "Guard.end_step (whole)": end_step,
    }
    print(f"{reps} reps, torch {torch.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(f"{'':34s} {'after compute: min, median, p90':>23s}   back to back: min, median, p90")
    results: dict[tuple[str, bool], list[float]] = {(n, c): [] for n in parts for c in (True, False)}
    order = list(results)
    for _ in range(reps):
        random.shuffle(order)
        for name, cold in order:
            call = parts[name]
            if cold:
                compute()
            if name.startswith("2nd write") or not cold:
                call()  # the first of the pair; back to back, the same call just made
            t0 = time.perf_counter_ns()
            call()
            results[(name, cold)].append((time.perf_counter_ns() - t0) / 1000)
    for name in parts:
        row = []
        for cold in (True, False):
            v = sorted(results[(name, cold)])
            row += [v[0], statistics.median(v), v[int(0.9 * len(v))]]
        cells = " ".join(f"{v:7.1f}" for v in row)
        print(f"{name:34s} {cells}")
    guard.close()


if __name__ == "__main__":
    main()

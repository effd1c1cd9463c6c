"""A log with one line of gigabytes among its records, for each family of readers: time and peak memory.

Each family's log is 100 records, one line of ``--mib`` MiB without a record in it, 100 records
more (a JSON document: a ``trainer_state.json`` whose note is that long, read with its format named,
as detection never reads past the bound). ``analyze`` runs on it as a new process (under an 8 GB
address-space limit) with this checkout's ``src``, and with ``--baseline``'s where given; the figures
measured before the line bound are printed beside.

    python benchmarks/long_lines.py [--mib 2048] [--only text_log] [--baseline /path/to/old/src]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

SRC = Path(__file__).resolve().parent.parent / "src"
# Before the line bound (2 GiB, /usr/bin/time, load 2.3-5.5 on 2 cores): seconds, peak RSS MB.
BASELINE: dict[str, tuple[float, float]] = {
    "llmc_stdout": (51.9, 4148),
    "text_log": (120.0, 4214),  # killed at 120 s, still reading
    "megatron_text": (45.6, 4148),
    "dict_log": (19.0, 4131),
    "composer_console": (62.8, 4148),
    "csv": (8.9, 4205),  # and refused: "a quote opened in a cell and never closed"
    "hf_trainer_state": (6.9, 4117),
}
LAYOUTS: dict[str, Callable[[int, float], str]] = {
    "llmc_stdout": lambda s, v: (
        f"step {s:4d}/200 | train loss {v:.6f} | norm 1.0000 | lr 1.00e-04 | 10.00 ms"
    ),
    "text_log": lambda s, v: f"step {s} | loss {v:.6f}",
    "megatron_text": lambda s, v: (
        f" iteration {s:8d}/    1000 | lm loss: {v:.6E} | grad norm: 1.000 | number of skipped iterations:"
        "   0 | number of nan iterations:   0 |"
    ),
    "dict_log": lambda s, v: (
        f"{{'loss': {v:.4f}, 'grad_norm': 1.0, 'learning_rate': 0.0001, 'epoch': {s / 100}}}"
    ),
    "composer_console": lambda s, v: f"[batch={s}/200]:\n\t Train loss/train/total: {v:.6f}",
    "csv": lambda s, v: f"{s},{v:.6f}",
}
DOCUMENT = "hf_trainer_state"
_CHUNK = b"x" * (64 << 20)


def write_case(path: Path, fmt: str, mib: int) -> None:
    with open(path, "wb") as f:
        if fmt == DOCUMENT:
            state = json.dumps({"log_history": [{"step": s, "loss": 3 * 0.99**s} for s in range(1, 201)]})
            f.write((state[:-1] + ', "note": "').encode())
            _blob(f, mib)
            f.write(b'"}')
            return
        rows = [LAYOUTS[fmt](s, 3 * 0.99**s) for s in range(1, 201)]
        f.write((("step,loss\n" if fmt == "csv" else "") + "\n".join(rows[:100]) + "\n").encode())
        _blob(f, mib)
        f.write(("\n" + "\n".join(rows[100:]) + "\n").encode())


def _blob(f: BinaryIO, mib: int) -> None:
    left = mib << 20
    while left > 0:
        f.write(_CHUNK[:left])
        left -= len(_CHUNK)


def measure(src: Path, path: Path, fmt: str) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MB) and the last line of what ``analyze`` said, under ``src``."""
    if fmt == DOCUMENT:
        code = (
            "import sys\nfrom steadytune.importers import UnreadableLog, load\n"
            f"try: print(len(load(sys.argv[1], {fmt!r}).records), 'records')\n"
            "except UnreadableLog as e: print('UnreadableLog:', e)"
        )
        cmd = [sys.executable, "-c", code, str(path)]
    else:
        cmd = [sys.executable, "-m", "steadytune.cli.main", "analyze", str(path)]
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    with tempfile.TemporaryFile() as out:
        t = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=limit)
        _, _, usage = os.wait4(proc.pid, 0)  # this child's own peak, not the largest of all so far
        proc.returncode = 0
        took = time.monotonic() - t
        out.seek(0)
        said = [line for line in out.read().decode(errors="replace").splitlines() if line.strip()]
    return took, usage.ru_maxrss / 1024, (said[-1].strip() if said else "")[:150]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=2048, help="the long line's size (default 2 GiB)")
    p.add_argument("--only", action="append", choices=[*LAYOUTS, DOCUMENT], help="one family (repeatable)")
    p.add_argument("--baseline", type=Path, help="another checkout's src, measured beside this one")
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; line of {args.mib} MiB")
    with tempfile.TemporaryDirectory(prefix="steadytune-long-lines-") as tmp:
        for fmt in args.only or [*LAYOUTS, DOCUMENT]:
            path = Path(tmp) / ("trainer_state.json" if fmt == DOCUMENT else "train.log")
            write_case(path, fmt, args.mib)
            for name, src in (("baseline", args.baseline), ("this", SRC)):
                if src is not None:
                    took, rss, said = measure(src, path, fmt)
                    print(
                        f"{fmt:17} {name:8} {took:6.1f} s {rss:7.0f} MB  load {os.getloadavg()[0]:.1f} {said}"
                    )
            before = BASELINE[fmt]
            print(f"{fmt:17} before   {before[0]:6.1f} s {before[1]:7.0f} MB  (2 GiB line, before the bound)")
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())

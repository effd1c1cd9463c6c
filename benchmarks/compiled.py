"""What compiling the detectors' hot modules would give ``analyze``: an experiment, nothing installed.

    python benchmarks/compiled.py LOG                 # e.g. the 1M-step log benchmarks/scale.py writes
    python benchmarks/compiled.py LOG --repeat 3 --modules steadytune/detect/stats.py ...

Every rule of ``analyze`` is a few dozen Python operations a point; the interpreter's own turn
for each (a call, an attribute, a float boxed) is most of what a point costs, whatever the rule.
This copies ``src/`` into a scratch folder, compiles ``--modules`` there with mypyc (shipped with
mypy, a dev dependency; it needs a C compiler), and runs ``steadytune analyze --format json LOG``
as a new process on the plain source and on the compiled copy, alternated ``--repeat`` times:
CPU (user + system) and peak memory of each run, the load average beside them, and whether the
two reports are byte for byte the same (they must be: mypyc compiles the same code, with the
same float arithmetic). Nothing in the checkout changes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The modules of the loss series and its rules, where a plain SFT step's detection spends most of its
# time (docs/scale.md, *What grows*). Each compiled module is type-checked first: the engine
# (detect/live.py) is not compiled as it stands, since mypyc reads no project config and without
# pydantic's mypy plugin the defaults of DetectConfig() look like missing arguments.
HOT = (
    "steadytune/detect/stats.py",
    "steadytune/detect/trend.py",
    "steadytune/detect/loss.py",
    "steadytune/detect/loss_rules.py",
    "steadytune/detect/early.py",
)
# The console script's entry point, run by the interpreter of this benchmark on PYTHONPATH's code.
_ENTRY = "import sys; from steadytune.cli.main import entrypoint; sys.exit(entrypoint())"


def compile_copy(dest: Path, modules: list[str]) -> None:
    """``src/steadytune`` copied into ``dest``, ``modules`` compiled in place beside their sources."""
    shutil.copytree(
        ROOT / "src" / "steadytune", dest / "steadytune", ignore=shutil.ignore_patterns("__pycache__")
    )
    cmd = [sys.executable, "-m", "mypyc", "--ignore-missing-imports", *modules]
    done = subprocess.run(cmd, cwd=dest, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"mypyc failed ({done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-4000:]}")


def analyze(src: Path, log: Path) -> tuple[float, int, bytes]:
    """CPU seconds, peak resident KB and the JSON report of one ``analyze`` run on ``src``'s code."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, "-c", _ENTRY, "analyze", "--format", "json", str(log)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read() if proc.stdout else b""
    _pid, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 1):  # 1: anomalies found
        sys.exit(f"analyze on {src} exited with {os.waitstatus_to_exitcode(status)}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", type=Path, help="a JSON-lines log to analyze")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each, alternated")
    ap.add_argument("--modules", nargs="+", default=list(HOT), help="paths under src/ to compile")
    ap.add_argument(
        "--built", type=Path, help="a copy compiled before (the folder holding steadytune/): no build"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="steadytune-compiled-") as tmp:
        if args.built is None:
            print(f"compiling {len(args.modules)} modules with mypyc ...", flush=True)
            compile_copy(Path(tmp), args.modules)
        compiled = args.built or Path(tmp)
        reports = set()
        for i in range(args.repeat):
            for name, src in (("source", ROOT / "src"), ("compiled", compiled)):
                cpu, peak, out = analyze(src, args.log)
                reports.add(out)
                load = os.getloadavg()[0]
                print(
                    f"run {i + 1} {name:>8}: {cpu:6.2f} s CPU, {peak / 1024:6.1f} MB peak (load {load:.1f})"
                )
    print("reports: " + ("identical" if len(reports) == 1 else "DIFFERENT"))
    return 0 if len(reports) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())

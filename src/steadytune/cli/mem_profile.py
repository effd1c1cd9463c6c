"""``steadytune mem-profile --pid P``: is this process leaking, and when will it run out?"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, add_format, fail

MIB = 1024**2


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "mem-profile",
        "sample a process tree's memory and project when it runs out",
        "steadytune mem-profile --pid 4242 --seconds 120 --interval 1 --plot mem.png",
        description="Sample RSS and USS of a process and its children (and, with NVML, their GPU "
        "memory), report "
        "a robust growth rate (Theil–Sen slope) and a projection to OOM against the available RAM / GPU "
        "total. "
        "For a steadytune worker it adds the torch allocator figures from the run's step records. "
        "Exit code 1 when a leak is suspected.",
    )
    p.add_argument("--pid", type=int, required=True, help="the process to watch (its children are included)")
    p.add_argument("--seconds", type=float, default=60.0, help="how long to sample (default 60)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    p.add_argument(
        "--plot", type=Path, default=None, metavar="OUT.png", help="write a chart (needs matplotlib)"
    )
    add_format(p)
    p.set_defaults(func=main)


def worker_run_dir(proc: Any) -> Path | None:
    """The run directory of a steadytune worker (or a supervisor's worker) in this process tree."""
    try:
        tree = [proc, *proc.children(recursive=True)]
    except Exception:
        tree = [proc]
    for p in tree:
        try:
            cmd = p.cmdline()
        except Exception:
            continue
        if any("steadytune.train.worker" in c for c in cmd) and "--run-dir" in cmd:
            i = cmd.index("--run-dir")
            if i + 1 < len(cmd):
                return Path(cmd[i + 1])
    return None


def _mib(x: float | None) -> str:
    return "N/A" if x is None else f"{x / MIB:,.1f} MiB"


def _eta(s: float | None) -> str:
    if s is None:
        return "never at this rate"
    if s < 120:
        return f"{s:.0f} s"
    return f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def render(rep: Any) -> str:
    lines = [
        f"pid {rep.pid}: {rep.samples} samples over {rep.duration_s:.1f} s",
        "",
        f"  {'series':<6} {'first':>13} {'last':>13} {'peak':>13} {'slope':>14} {'trend':>6}  to OOM",
    ]
    for s in rep.series:
        lines.append(
            f"  {s.name:<6} {_mib(s.first):>13} {_mib(s.last):>13} {_mib(s.peak):>13} "
            f"{s.slope_bps * 60 / MIB:>+9.2f} MiB/min {s.agreement:>5.0%}  {_eta(s.eta_s)}"
            + ("  <-- growing" if s.growing else "")
        )
    if rep.allocator:
        lines += ["", f"torch allocator (step records, steps {rep.allocator['steps']}):"]
        for key in ("mem_allocated_bytes", "mem_reserved_bytes", "mem_peak_bytes"):
            a = rep.allocator.get(key)
            if a:
                lines.append(
                    f"  {key:<22} last {_mib(a['last'])}, max {_mib(a['max'])}, "
                    f"{a['slope_bytes_per_step'] / MIB:+.3f} MiB/step"
                )
    lines += [f"note: {n}" for n in rep.notes]
    lines += [
        "",
        "verdict: LEAK SUSPECTED — memory grows steadily"
        if rep.leak_suspected
        else "verdict: no steady growth",
    ]
    return "\n".join(lines)


def plot(samples: list[Any], rep: Any, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ts = [s.ts for s in samples]
    for s in rep.series:
        ys = [getattr(x, s.name) / MIB for x in samples]
        slope = s.slope_bps / MIB
        icpt = sorted(y - slope * t for t, y in zip(ts, ys, strict=True))[len(ys) // 2]  # Theil–Sen intercept
        (line,) = ax.plot(ts, ys, label=f"{s.name} ({s.slope_bps * 60 / MIB:+.1f} MiB/min)")
        ax.plot(
            [ts[0], ts[-1]],
            [icpt + slope * ts[0], icpt + slope * ts[-1]],
            "--",
            linewidth=0.8,
            color=line.get_color(),
        )
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_title(f"pid {rep.pid}" + (" — leak suspected" if rep.leak_suspected else ""))
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    import psutil

    from steadytune.forensics.memprof import TreeSampler, allocator_report, analyze, profile

    if args.interval <= 0 or args.seconds <= 0:
        return fail("--seconds and --interval must be positive", 2)
    try:
        proc = psutil.Process(args.pid)
    except psutil.Error:
        return fail(f"no process with pid {args.pid}; check the pid (ps, steadytune top)", 2)
    sampler = TreeSampler(args.pid)
    live = sys.stderr.isatty() and args.format == "text"

    def show(s: Any) -> None:
        if live:
            print(
                f"\r{s.ts:6.1f}s  rss {_mib(s.rss)}  uss {_mib(s.uss)}  gpu {_mib(s.gpu)}   ",
                end="",
                file=sys.stderr,
                flush=True,
            )

    samples = profile(sampler, args.seconds, args.interval, on_sample=show, alive=proc.is_running)
    if live:
        print(file=sys.stderr)
    rep = analyze(args.pid, samples, psutil.virtual_memory().available, sampler.gpu_total)
    run_dir = worker_run_dir(proc)
    if run_dir is not None:
        from steadytune.forensics.runview import final_steps
        from steadytune.rundir import RunDir

        recs = [r for rs in final_steps(RunDir(run_dir)).values() for r in rs if r.rank == 0]
        rep.allocator = allocator_report(recs)
        if rep.allocator is None:
            rep.notes.append(f"steadytune worker of {run_dir}: no torch allocator figures (CPU run)")
    if args.plot and samples:
        try:
            plot(samples, rep, args.plot)
        except ImportError:
            return fail("--plot needs matplotlib: pip install 'steadytune[plot]'")
    if args.format == "json":
        print(
            json.dumps(
                {
                    "pid": rep.pid,
                    "samples": rep.samples,
                    "duration_s": rep.duration_s,
                    "leak_suspected": rep.leak_suspected,
                    "series": [s.__dict__ for s in rep.series],
                    "allocator": rep.allocator,
                    "notes": rep.notes,
                },
                indent=1,
            )
        )
    else:
        print(render(rep))
        if args.plot:
            print(f"plot: {args.plot}")
    return 1 if rep.leak_suspected else 0

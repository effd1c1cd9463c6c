"""GPU truth: every CUDA path of steadytune checked on a real GPU, in one command, in under 8 minutes.

    python benchmarks/gpu_check.py --out gpu-check/              # on a CUDA machine
    python benchmarks/gpu_check.py --dry-run --out /tmp/gpu-check # every step on CPU (the tests run it)
    python benchmarks/gpu_check.py --wheels gpu-wheels/ --out gpu-check/   # install missing needs first

It writes ``gpu_check.json`` (everything, machine-readable), ``gpu_check.md`` (the same for people)
and ``gpu_check.log`` (each step's output) into ``--out``. Each check is pass / fail / skipped, with
its assertions and its figures:

1. telemetry   a supervised native ``steadytune run`` of a Llama-shaped model of about 1B parameters
               (random weights from a config, bf16, LoRA) for 60 steps: NVML rows in system.jsonl once
               a second, CUDA allocated/reserved/peak in every step record, both through the dashboard
               API, and data in its GPU panels.
2. oom         a real CUDA OOM: the server's per-process memory cap (``guard/memcap.py``, which calls
               ``torch.cuda.set_per_process_memory_fraction``) caps the process between
               the split and the unsplit peak of one micro-batch; the guard splits it in-process (no
               restart, the same samples in the step) and its gradients equal the unsplit ones, measured
               before the cap (rtol 1e-5, atol 1e-6, as in tests/integration/test_oom_split.py).
3. estimator   ``steadytune estimate --measure`` for full / LoRA / QLoRA x two batch and sequence sizes
               on 1B- and 3B-shaped models, plus one run with gradient checkpointing: the signed error of
               each estimate against the measured peak; goal median |error| <= 5%, worst <= 10%.
4. leak        a worker that keeps tensors alive (fault ``leak_mib_per_step``): ``memory_leak`` fires, a
               checkpoint is written, and the allocator snapshot the supervisor then asks for is saved
               and readable.
5. overhead    the guard's per-step overhead against a bare HF ``Trainer`` on the same job, interleaved
               A/B pairs (goal < 1%), and the gradient-flow overhead at its default interval (goal < 2%).
6. quant       ``quant-check`` on the demo model: int8 and NF4 (bitsandbytes, when installed) and fp8
               (torchao, GPUs with compute capability >= 8.9) against the bf16 reference, with every
               figure, CUDA peaks and the plot; and the server's GPU ledger on real NVML: two
               processes share the GPU as two jobs, each matched by pid and charged what it holds,
               a third counted as foreign (step ``ledger``).
7. unsloth     an unsloth LoRA run (a script as its users write one) under ``supervise --preset hf
               --inject``: the trainer SIGKILLed after its first checkpoint, the restart resuming it,
               the guard inside unsloth's patched trainer, every step recorded, finite weights
               (benchmarks/_gpu_check_unsloth.py; unsloth's wheels from WITH_UNSLOTH=1 gpu_wheels.sh).

And a last one, ``cleanup``: no process the script started is left, none on the GPU.

How it runs: this process never imports torch. Each step runs in a child process of its own
(``--child``), in its own session, under a timeout; every process started below it carries a marker
in its environment, and whatever still carries it when a step ends (or the script exits, however it
exits) is killed. The whole run keeps to ``--budget-s`` (default 450 s): a step that no longer fits
is reported as skipped, not started.

``--dry-run`` runs every step on CPU with tiny shapes (the demo model, few steps) and records every
CUDA-only assertion as skipped with its reason, so the script is exercised where no GPU is and cannot
rot; its report says plainly that it is not a GPU result. Without ``--dry-run`` and without a CUDA
device it refuses (exit 2). Exit codes: 0 no check failed, 1 some check failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from _gpu_check_steps import (
    CAPS,
    MARKER,
    NO_CUDA,
    REPO,
    SRC,
    STEP_FUNCS,
    Check,
    Ctx,
    GiB,
    MiB,
    check_later,
    check_status,
    kill_group,
    kill_marked,
    marked_pids,
    nvml_compute_processes,
    say,
    tail,
)
from _gpu_check_unsloth import UNSLOTH_SITE, step_unsloth

CHECKS: tuple[tuple[int, str, str], ...] = (
    (1, "telemetry", "Telemetry: NVML samples, CUDA memory in step records, dashboard API and GPU panels"),
    (2, "oom", "A real CUDA OOM, split in-process by the guard"),
    (3, "estimator", "The estimator against measured peaks on the same device"),
    (4, "leak", "Memory leak: memory_leak, a checkpoint, an allocator snapshot"),
    (5, "overhead", "Overheads: the guard against a bare HF Trainer; gradient flow"),
    (6, "later", "quant-check (int8, NF4, fp8) and the server's GPU ledger"),
    (7, "unsloth", "unsloth LoRA under supervise --inject: the trainer killed, resumed, completed"),
)
STEPS = (
    "probe",
    "assets",
    "telemetry",
    "oom",
    "leak",
    "overhead",
    "quant",
    "ledger",
    "estimator",
    "unsloth",
)  # the order they run in
CHECK_STEPS = ("telemetry", "oom", "estimator", "leak", "overhead", "quant", "ledger", "unsloth")
# The least time a step must have left to be started (on a GPU).
MIN_START = {
    "probe": 20,
    "assets": 30,
    "telemetry": 60,
    "oom": 40,
    "leak": 45,
    "overhead": 60,
    "estimator": 45,
    "quant": 40,
    "ledger": 20,
    "unsloth": 90,
}
STEPS_RUN = {**STEP_FUNCS, "unsloth": step_unsloth}  # what each step name runs


def child_main(args: argparse.Namespace) -> int:
    ctx = Ctx(Path(args.work), args.dry_run, float(args.deadline), set(args.checks.split(",")))
    results = ctx.work / "results"
    results.mkdir(parents=True, exist_ok=True)
    token = os.environ.get(MARKER, "")
    for name in args.child.split(","):
        check = Check(name)
        t0 = time.time()
        say(f"step {name}")
        try:
            STEPS_RUN[name](ctx, check)
        except Exception as exc:
            tb = traceback.format_exc()
            print(tb, flush=True)
            check.expect("the step ran to its end", False, f"{type(exc).__name__}: {exc}\n{tb[-1500:]}")
        finally:
            if token:
                kill_marked(token)  # whatever this step started dies with it (never this process)
        check.wall_s = time.time() - t0
        (results / f"{name}.json").write_text(json.dumps(check.to_dict(), indent=1, default=str))
        say(f"step {name} done in {check.wall_s:.1f} s")
    return 0


# ============================================================================ parent


class Parent:
    """Runs the steps as children, kills whatever they leave, writes the report."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dry = bool(args.dry_run)
        self.out = Path(args.out)
        self.work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="steadytune-gpu-check-"))
        self.token = uuid.uuid4().hex
        self.t0 = time.time()
        self.deadline = self.t0 + float(args.budget_s)
        self.selected = set(args.only.split(",")) if args.only else set(CHECK_STEPS)
        self.results: dict[str, dict[str, Any]] = {}
        self.step_notes: dict[str, str] = {}
        self.children: list[subprocess.Popen] = []
        self.killed_at_end: list[int] = []
        self.site: Path | None = None
        self.unsloth_site: Path | None = None  # unsloth and its pins, for check 7 only
        self.report_checks: list[dict[str, Any]] = []
        self.refused = False
        self.lost: dict[str, str] = {}  # steps whose process ended without a result: why
        self.interrupted: str | None = None  # the signal that stopped this run, if one did
        self._cleaned = False

    # -- processes -------------------------------------------------------------
    def env(self) -> dict[str, str]:
        paths = [str(self.site)] if self.site else []
        paths += [str(SRC), str(REPO)]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        cache = Path(os.environ.get("STEADYTUNE_CACHE") or self.work / "cache")
        env = {
            **os.environ,
            MARKER: self.token,
            "PYTHONPATH": os.pathsep.join(paths),
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "STEADYTUNE_CACHE": str(cache),
            "STEADYTUNE_DATA_CACHE": os.environ.get("STEADYTUNE_DATA_CACHE") or str(self.work / "data-cache"),
        }
        if self.unsloth_site:
            env[UNSLOTH_SITE] = str(self.unsloth_site)
        if self.dry:
            env["CUDA_VISIBLE_DEVICES"] = ""  # a dry run is a CPU run, on a GPU machine too
        return env

    def cleanup(self) -> None:
        if self._cleaned:
            return
        self._cleaned = True
        for proc in self.children:
            if proc.poll() is None:
                kill_group(proc)
        self.killed_at_end = kill_marked(self.token)

    def install_wheels(self) -> None:
        wheels = sorted(Path(self.args.wheels).glob("*.whl"))
        if not wheels:
            raise SystemExit(f"--wheels {self.args.wheels}: no .whl files there")
        self.site = self._install(wheels, self.work / "site")
        unsloth = sorted((Path(self.args.wheels) / "unsloth").glob("*.whl"))
        if unsloth:  # unsloth pins older transformers and TRL: a folder of their own, for check 7 only
            self.unsloth_site = self._install(unsloth, self.work / "site-unsloth")

    def _install(self, wheels: list[Path], site: Path) -> Path:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--target",
            str(site),
            *map(str, wheels),
        ]
        print(f"installing {len(wheels)} wheels into {site}", flush=True)
        subprocess.run(cmd, check=True)
        return site

    def run_steps(self, steps: list[str]) -> None:
        left = self.deadline - time.time()
        cap = sum(CAPS[s] for s in steps) if not self.dry else 600
        need = 0 if self.dry else MIN_START[steps[0]]
        if left < need:
            for s in steps:
                self.step_notes[s] = f"time budget spent ({left:.0f} s left of {self.args.budget_s:g} s)"
            return
        timeout = min(cap, left)
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            ",".join(steps),
            "--work",
            str(self.work),
            "--deadline",
            str(self.t0 + float(self.args.budget_s)),
            "--checks",
            ",".join(sorted(self.selected)),
        ]
        if self.dry:
            cmd.append("--dry-run")
        log = self.work / "logs" / f"steps-{'+'.join(steps)}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"-> {', '.join(steps)} (at most {timeout:.0f} s)", flush=True)
        t0 = time.time()
        with open(log, "ab") as f:
            proc = subprocess.Popen(
                [*cmd],
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                cwd=REPO,
                start_new_session=True,
            )
            self.children.append(proc)
            try:
                rc: int | str = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                rc = f"killed after its {timeout:.0f} s"
            kill_group(proc)
        kill_marked(self.token)
        for s in steps:
            path = self.work / "results" / f"{s}.json"
            if path.exists():
                self.results[s] = json.loads(path.read_text())
                st, _ = check_status(self.results[s]["assertions"])
                print(f"   {s}: {st} ({self.results[s]['wall_s']:.1f} s)", flush=True)
            else:
                self.lost[s] = f"its process ended ({rc}) before writing a result; see gpu_check.log"
                print(f"   {s}: no result ({rc})", flush=True)
        print(f"   ({time.time() - t0:.1f} s)", flush=True)

    # -- the run ---------------------------------------------------------------
    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        if self.args.wheels:
            self.install_wheels()
        gpu_before = None if self.dry else nvml_compute_processes()[0]
        try:
            self.run_steps(["probe"])
            probe = self.results.get("probe", {}).get("figures", {})
            if not self.dry and not probe.get("cuda_available"):
                why = (
                    probe.get("import_errors") or self.step_notes.get("probe") or "torch sees no CUDA device"
                )
                print(
                    f"error: no CUDA device ({why}); run with --dry-run to exercise every step on CPU",
                    file=sys.stderr,
                )
                self.refused = True
                return 2
            broken = probe.get("import_errors")
            if broken and not self.dry:
                for s in CHECK_STEPS:
                    self.lost[s] = (
                        "not run: steadytune's paths do not import here ("
                        + "; ".join(broken)
                        + "); carry the wheels benchmarks/gpu_wheels.sh downloads and pass --wheels"
                    )
                return 1
            wanted = [s for s in STEPS[1:] if s == "assets" or s in self.selected]
            if self.dry:
                self.run_steps(wanted)  # one process: the torch imports are what a CPU run spends most on
            else:
                for s in wanted:
                    self.run_steps([s])
        finally:
            # Also when interrupted: kill what is left, then say what was found so far.
            self.cleanup()
            if not self.refused:
                self.report(gpu_before)
        return 1 if any(c["status"] == "fail" for c in self.report_checks) else 0

    def cleanup_check(self, gpu_before: dict[int, int] | None) -> dict[str, Any]:
        check = Check("cleanup")
        check.figures["processes_killed_at_the_end"] = self.killed_at_end
        if self.interrupted:
            check.skip(
                "no process outlived the step that started it",
                f"interrupted ({self.interrupted}): what was running then was killed: {self.killed_at_end}",
            )
        else:
            check.expect(
                "no process outlived the step that started it",
                not self.killed_at_end,
                f"killed at the end: {self.killed_at_end}" if self.killed_at_end else "",
            )
        left = marked_pids(self.token, {os.getpid()})
        check.expect(
            "no process this script started is left", not left, f"still there: {left}" if left else ""
        )
        if self.dry:
            check.skip("no GPU process of ours remains (NVML)", NO_CUDA)
        else:
            after, why = nvml_compute_processes()
            for _ in range(50):  # the driver needs a moment to let go of a killed process
                if after is None or not set(after) - set(gpu_before or {}):
                    break
                time.sleep(0.2)
                after, why = nvml_compute_processes()
            if after is None or gpu_before is None:
                # Some virtualised GPUs do not list processes: the marker scan above still holds.
                check.skip("no GPU process of ours remains (NVML)", f"NVML lists no processes here: {why}")
            else:
                ours = {pid: b for pid, b in after.items() if pid not in gpu_before}
                check.figures["gpu_processes_before"] = len(gpu_before)
                check.expect(
                    "no GPU process of ours remains (NVML)",
                    not ours,
                    f"new compute processes: {ours}" if ours else "none",
                )
        d = check.to_dict()
        d["status"], d["reason"] = check_status(d["assertions"])
        return d

    def report(self, gpu_before: dict[int, int] | None) -> None:
        # Steps that finished while this process was being interrupted left their results on disk.
        for path in sorted((self.work / "results").glob("*.json")):
            self.results.setdefault(path.stem, json.loads(path.read_text()))
        env = self.results.get("probe", {}).get("figures", {})
        checks = []
        for number, name, title in CHECKS:
            if name == "later":
                d = check_later(self.results.get("quant"), self.results.get("ledger")).to_dict()
                for step, what in (("ledger", "the GPU ledger step ran"), ("quant", "quant-check ran")):
                    if step in self.results:
                        continue
                    why = (
                        self.lost.get(step)
                        or self.step_notes.get(step)
                        or ("not selected (--only)" if step not in self.selected else "no result")
                    )
                    status = "fail" if step in self.lost else "skipped"
                    key = "detail" if status == "fail" else "reason"
                    d["assertions"].insert(0, {"name": what, "status": status, key: why})
            elif name in self.results:
                d = self.results[name]
            else:
                if name in self.lost:
                    a = {"name": "the step ran to its end", "status": "fail", "detail": self.lost[name]}
                else:
                    why = self.step_notes.get(name) or (
                        "not selected (--only)"
                        if name not in self.selected
                        else f"interrupted ({self.interrupted}) before it ended"
                        if self.interrupted
                        else "no result"
                    )
                    a = {"name": "the step ran", "status": "skipped", "reason": why}
                d = {"name": name, "figures": {}, "notes": [], "wall_s": 0.0, "assertions": [a]}
            status, reason = check_status(d["assertions"])
            checks.append({"number": number, "title": title, **d, "status": status, "reason": reason})
        cleanup = self.cleanup_check(gpu_before)
        checks.append(
            {
                "number": len(CHECKS) + 1,
                "title": "Cleanup: nothing left running, nothing left on the GPU",
                **cleanup,
            }
        )
        self.report_checks = checks
        on_gpu = bool(env.get("cuda_available")) and not self.dry
        notice = (
            f"Ran on {env.get('device')} ({env.get('device_memory_bytes', 0) / GiB:.0f} GiB), "
            f"torch {env.get('torch')} (CUDA {env.get('torch_cuda')})."
            if on_gpu
            else "DRY RUN ON CPU: this is not a GPU result. Every step ran with tiny shapes and every "
            "CUDA-only assertion is marked skipped; a GPU run must still confirm them."
        )
        doc = {
            "tool": "benchmarks/gpu_check.py",
            "mode": "dry-run" if self.dry else "gpu",
            "ran_on_gpu": on_gpu,
            "notice": notice,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.t0)),
            "wall_s": round(time.time() - self.t0, 1),
            "budget_s": float(self.args.budget_s),
            "commit": git_commit(),
            "environment": env,
            "assets": self.results.get("assets", {}).get("figures", {}),
            "checks": checks,
            "summary": {k: sum(c["status"] == k for c in checks) for k in ("pass", "fail", "skipped")},
        }
        (self.out / "gpu_check.json").write_text(json.dumps(doc, indent=1, default=str))
        (self.out / "gpu_check.md").write_text(markdown(doc))
        logs = sorted((self.work / "logs").glob("*.log")) if (self.work / "logs").exists() else []
        with open(self.out / "gpu_check.log", "w", encoding="utf-8") as f:
            for log in logs:
                f.write(f"===== {log.name}\n{tail(log, 400_000)}\n")
        print(
            f"wrote {self.out / 'gpu_check.json'} and {self.out / 'gpu_check.md'}: {doc['summary']}, "
            f"{doc['wall_s']:.0f} s",
            flush=True,
        )


def git_commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and abs(value) >= 10 * MiB:
        return f"{value:,} ({value / GiB:.2f} GiB)"
    if isinstance(value, (list, dict)):
        return "`" + json.dumps(value, default=str)[:300] + "`"
    return str(value)


def markdown(doc: dict[str, Any]) -> str:
    mark = {"pass": "PASS", "fail": "FAIL", "skipped": "skipped"}
    lines = [
        f"# steadytune GPU check — {doc['mode']}",
        "",
        f"**{doc['notice']}**",
        "",
        f"Commit {doc['commit']}, started {doc['started']}, {doc['wall_s']:.0f} s of a "
        f"{doc['budget_s']:.0f} s budget. "
        f"Summary: {doc['summary']['pass']} pass, {doc['summary']['fail']} fail, "
        f"{doc['summary']['skipped']} skipped.",
        "",
        "| # | check | status | wall s |",
        "|---|---|---|---|",
    ]
    for c in doc["checks"]:
        lines.append(f"| {c['number']} | {c['title']} | {mark[c['status']]} | {c.get('wall_s', 0):.1f} |")
    for c in doc["checks"]:
        lines += ["", f"## {c['number']}. {c['title']} — {mark[c['status']]}", ""]
        if c.get("reason"):
            lines += [f"{c['status']}: {c['reason']}", ""]
        for a in c["assertions"]:
            why = a.get("detail") or a.get("reason") or ""
            why = why.replace("\n", " ")[:600]
            lines.append(f"- {mark[a['status']]}: {a['name']}" + (f" — {why}" if why else ""))
        if c["name"] == "estimator" and c["figures"].get("cases"):
            lines += ["", "| case | device | estimated | measured | error |", "|---|---|---|---|---|"]
            for r in c["figures"]["cases"]:
                if r["status"] == "measured":
                    lines.append(
                        f"| {r['case']} | {r['device']} | {r['estimated_bytes'] / GiB:.3f} GiB | "
                        f"{r['measured_bytes'] / GiB:.3f} GiB | {r['error_pct']:+.2f}% |"
                    )
                else:
                    lines.append(f"| {r['case']} | - | - | - | {r['status']}: {r.get('reason', '')[:120]} |")
        if c["name"] == "overhead" and c["figures"].get("pairs"):
            lines += [
                "",
                "| pair | order | bare ms/step | guarded ms/step | overhead |",
                "|---|---|---|---|---|",
            ]
            for i, p in enumerate(c["figures"]["pairs"], 1):
                lines.append(
                    f"| {i} | {p['order']} | {p['bare_ms']:.2f} | {p['guarded_ms']:.2f} | "
                    f"{p['overhead_pct']:+.2f}% |"
                )
        figures = {k: v for k, v in c.get("figures", {}).items() if k not in ("cases", "pairs")}
        if figures:
            lines += ["", "Figures: " + "; ".join(f"{k} {_fmt(v)}" for k, v in figures.items())]
        for note in c.get("notes", []):
            lines += ["", f"Note: {note}"]
    env = doc.get("environment") or {}
    if env:
        lines += ["", "## Environment", "", "; ".join(f"{k} {_fmt(v)}" for k, v in env.items())]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu-check", help="folder for gpu_check.json, .md and .log (created)")
    ap.add_argument("--dry-run", action="store_true", help="every step on CPU, CUDA assertions skipped")
    ap.add_argument("--wheels", help="folder of wheels to install (pip --no-index) before the steps run")
    ap.add_argument(
        "--only", help=f"comma-separated checks to run, of {','.join(CHECK_STEPS)} (default: all)"
    )
    ap.add_argument("--budget-s", type=float, default=450.0, help="the whole run's time budget (default 450)")
    ap.add_argument("--work", help="scratch folder (default: a temporary one, removed at the end)")
    ap.add_argument(
        "--keep-work", action="store_true", help="keep the scratch folder (models, run directories)"
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", help=argparse.SUPPRESS)
    ap.add_argument("--checks", default=",".join(CHECK_STEPS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.only:
        unknown = set(args.only.split(",")) - set(CHECK_STEPS)
        if unknown:
            ap.error(f"--only: unknown check(s) {sorted(unknown)}; known: {', '.join(CHECK_STEPS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    parent = Parent(args)
    atexit.register(parent.cleanup)

    def stop(signum: int, _frame: Any) -> None:
        parent.interrupted = signal.Signals(signum).name
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    try:
        return parent.run()
    finally:
        parent.cleanup()
        if not args.keep_work and not args.work:
            shutil.rmtree(parent.work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())

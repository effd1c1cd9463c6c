"""What steadytune costs: the same job run three ways, interleaved, beside the bare HF Trainer.

    python benchmarks/overhead.py [--rounds 3] [--steps 200] [--skip-micro] [--save-mb 200]

The job is ``steadytune demo``'s (the embedded tiny Llama, full fine-tune, batch 8,
an eval and a checkpoint every quarter). Each round runs, in a rotated order:

- ``bare``: a plain HF ``Trainer`` built from the same config by the worker's own
  functions (benchmarks/_overhead_trainer.py), so its arguments are identical;
- ``+guard``: the same Trainer with steadytune's ``GuardCallback`` and checkpoint keeper;
- ``run``: ``steadytune run`` on the config: supervisor, preflight, worker (whose imports run
  beside the preflight);
- ``run-serial`` (only with ``--only``): ``steadytune run`` with ``recover.standby_worker=false``, so
  the first attempt's worker starts after the preflight in a new process, as every run's once did.

Figures, each as median [min–max] over the rounds and the ratio of medians to ``bare``:

- step ms: the median interval between step ends (step records for ``run``), so
  the few steps that evaluate or save do not count;
- first step s: launch of the process to the end of step 1;
- GO → step 1 s (``run`` only): the preflight's verdict (the ``run_started`` event) to the end
  of step 1, what the worker still does once it may train;
- save ms: per checkpoint, HF's own ``_save_checkpoint``, and for ``+guard`` that
  plus the publish (fsync, rename, manifest);
- wall s: launch to exit.

Then the guard's own in-loop time per step (its four loop hooks, timed inside the
``+guard`` runs), a micro-benchmark of its parts in µs, and the save figure again on a
wider model whose checkpoint is about ``--save-mb`` MB (built from a config, offline;
0 skips it). Last, recovery times (benchmarks/recovery_time.py): a rollback inside the
running worker beside the same rollback by a restart, and a kill through the standby
worker beside one in a new process. Targets (the design's):
guard ≤ 80 µs per step, first step ≤ bare + 1 s, save ≤ bare + 10%, a rollback ≤ 1 s plus
the checkpoint load, a kill ≤ 5 s to the first new step.

Run it on a quiet machine: the figures are timings, so other load moves them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
VARIANTS = ("bare", "+guard", "run", "run-serial")
DEFAULT = ("bare", "+guard", "run")


def write_config(work: Path, steps: int, model: Path | None = None) -> Path:
    """The demo's config as a YAML file (``model``: a wider model, saved every ``steps // 2``, no eval)."""
    import yaml

    from steadytune.cli.demo import demo_config
    from steadytune.train.assets import ensure_demo_assets

    data = demo_config(ensure_demo_assets(), str(work / "runs"), steps, "full")
    if model is not None:
        data["model"]["name_or_path"] = str(model)
        data["data"].pop("eval_file")
        # Saves a few steps apart, as in a real run: a publish goes on beside the steps after its
        # save, and should not be timed against the next save of the same tiny job.
        data["train"].update(save_steps=max(1, steps // 2), eval_steps=None)
    path = work / ("demo.yaml" if model is None else f"{model.name}.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _env() -> dict[str, str]:
    src = str(HERE.parent / "src")
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{path}" if path else src, "HF_HUB_OFFLINE": "1"}


def _intervals(ts: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(ts)]


def run_bare(config: Path, out: Path, guard: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / "_overhead_trainer.py"), "--config", str(config), "--out", str(out)]
    launched = time.time()
    cmd += ["--launched-at", repr(launched)] + (["--guard"] if guard else [])
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, check=False)
    wall = time.time() - launched
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    data = json.loads(out.read_text(encoding="utf-8"))
    saves = [h + p for h, p in zip(data["hf_save_s"], data["publish_s"], strict=False)] if guard else []
    return {
        "step_ms": 1e3 * statistics.median(_intervals(data["step_end"])),
        "first_step_s": data["first_step_s"],
        "save_ms": 1e3 * statistics.median(saves or data["hf_save_s"]),
        "hf_save_ms": 1e3 * statistics.median(data["hf_save_s"]),
        "wall_s": wall,
        "guard_us": [ns / 1e3 for ns in data["guard_ns_per_step"]],
        "hook_us": {k: [ns / 1e3 for ns in v] for k, v in data.get("guard_hook_ns", {}).items()},
    }


def run_cli(config: Path, run_id: str, overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    from steadytune.config.load import load_config
    from steadytune.records import StepRecord
    from steadytune.telemetry.stream import iter_records

    cmd = [sys.executable, "-m", "steadytune.cli.main", "run", str(config), *overrides, "--quiet"]
    cmd += ["--run-id", run_id]
    launched = time.time()
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, check=False)
    wall = time.time() - launched
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    from steadytune.telemetry.events import read_events

    runs = Path(load_config(config, check_paths=False).run.runs_dir)
    go = next(e.ts for e in read_events(runs / run_id / "events.jsonl") if e.name == "run_started")
    steps = [
        r for r in iter_records(runs / run_id / "telemetry" / "rank-0.jsonl") if isinstance(r, StepRecord)
    ]
    ts = [r.ts for r in steps if not r.extra.get("eval")]
    return {
        "step_ms": 1e3 * statistics.median(_intervals(ts)),
        "first_step_s": ts[0] - launched,
        "go_to_step_s": ts[0] - go,
        "wall_s": wall,
    }


def wide_model(work: Path, mb: int) -> Path:
    """The demo model's architecture, wider and deeper, so a checkpoint (weights + AdamW) is ~``mb`` MB."""
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    from steadytune.train.assets import ensure_demo_assets

    demo = ensure_demo_assets() / "model"
    cfg = LlamaConfig.from_pretrained(demo)
    cfg.update({"hidden_size": 512, "intermediate_size": 1536, "num_attention_heads": 8,
                "num_key_value_heads": 4, "head_dim": 64})  # fmt: skip
    per_layer = 4 * 512 * 512 * 3 // 4 + 3 * 512 * 1536  # attention (q, o; k, v at half) + MLP
    # A checkpoint holds 12 bytes a parameter: fp32 weights and AdamW's two moments.
    cfg.num_hidden_layers = max(1, round((mb * 1e6 / 12 - 2 * 512 * cfg.vocab_size) / per_layer))
    out = work / f"wide-{mb}mb"
    LlamaForCausalLM(cfg).save_pretrained(out)
    for f in demo.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


def save_rounds(work: Path, mb: int, rounds: int) -> None:
    """HF's own save beside HF's + publish, per checkpoint of ~``mb`` MB, interleaved."""
    config = write_config(work, 12, wide_model(work, mb))
    hf: dict[str, list[float]] = {"bare": [], "+guard": []}
    ours: list[float] = []
    sealing: list[float] = []
    size = 0
    for r in range(rounds):
        for v in ("bare", "+guard") if r % 2 == 0 else ("+guard", "bare"):
            out = work / f"save-{v.strip('+')}-{r}.json"
            run_bare(config, out, guard=v == "+guard")
            data = json.loads(out.read_text(encoding="utf-8"))
            hf[v] += [1e3 * s for s in data["hf_save_s"]]
            if v == "+guard":
                ours += [1e3 * s for s in data["publish_s"]]
                sealing += [1e3 * s for s in data.get("sealing_s", [])]
                ckpts = sorted((out.with_suffix("") / "run" / "checkpoints").glob("checkpoint-*"))
                size = sum(p.stat().st_size for p in ckpts[-1].rglob("*") if p.is_file())
    base = statistics.median(hf["bare"])
    total = [h + p for h, p in zip(hf["+guard"], ours, strict=True)]
    print(f"save of a {size / 1e6:.0f} MB checkpoint ({len(total)} saves each, ms, median [min–max]):")
    print(f"  HF's own (bare)          {fmt(hf['bare'], None, 1)}")
    print(f"  HF's own (+guard)        {fmt(hf['+guard'], None, 1)}")
    print(f"  the guard's on_save      {fmt(ours, None, 1)}   (the loop waits this long)")
    print(f"  HF + on_save (+guard)    {fmt(total, hf['bare'], 1)} (target ≤ ×1.10)")
    print(f"  on_save / HF's own       {statistics.median(ours) / base:.1%}")
    if sealing:
        print(
            f"  publish: fsync, hash, rename, manifest   {fmt(sealing, None, 1)} "
            f"({statistics.median(sealing) / base:.0%} of HF's own; beside the next steps when it is not "
            f"on_save's)"
        )


def spread(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def fmt(values: list[float], base: list[float] | None, digits: int) -> str:
    if not values:
        return "-"
    lo, med, hi = spread(values)
    text = f"{med:.{digits}f} [{lo:.{digits}f}–{hi:.{digits}f}]"
    if base:
        text += f" ×{med / statistics.median(base):.3f}"
    return text


def print_table(results: dict[str, list[dict[str, Any]]], rows: list[tuple[str, str, int]]) -> None:
    width = 34
    shown = [v for v in VARIANTS if results[v] or v in DEFAULT]
    print(f"{'figure':<16}" + "".join(f"{v:>{width}}" for v in shown))
    for label, key, digits in rows:
        base = [r[key] for r in results["bare"] if key in r]
        cells = []
        for v in shown:
            vals = [r[key] for r in results[v] if key in r]
            cells.append(fmt(vals, base if v != "bare" else None, digits))
        print(f"{label:<16}" + "".join(f"{c:>{width}}" for c in cells))


def micro(steps: int) -> dict[str, float]:
    """µs per call of the guard's per-step parts, on a real tiny model's gradients."""
    import torch

    from steadytune.guard.core import Guard, memory_stats

    model = torch.nn.Linear(64, 64)
    model(torch.randn(8, 64)).sum().backward()
    loss = torch.tensor(1.5)
    norm = torch.tensor(2.0)
    with tempfile.TemporaryDirectory() as tmp:
        guard = Guard(tmp, rank=0, attempt=0)

        def one_step(i: int) -> None:
            guard.begin_step()
            guard.add_microbatch(loss, tokens=512, sample_ids=range(8))
            guard.before_update(model, None, grad_norm=norm)
            guard.end_step(i)
            guard.poll_control()

        parts: dict[str, Callable[[int], Any]] = {
            "whole step (begin, loss, update check, record, poll)": one_step,
            "per-micro-batch loss (add_microbatch)": lambda i: guard.add_microbatch(loss, tokens=512),
            "update check (before_update, norm given)": lambda i: guard.before_update(model, None, norm),
            "step record write (end_step)": guard.end_step,
            "memory reading (memory_stats)": lambda i: memory_stats(),
            "control poll (poll_control)": lambda i: guard.poll_control(),
        }
        out = {}
        for name, fn in parts.items():
            for i in range(200):  # warm-up
                fn(i)
            times = []
            for i in range(steps):
                t0 = time.perf_counter_ns()
                fn(i)
                times.append(time.perf_counter_ns() - t0)
            out[name] = statistics.median(times) / 1e3
        guard.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three variants")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every variant (default 1)")
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps per job")
    ap.add_argument("--micro-steps", type=int, default=5000, help="calls per part in the micro-benchmark")
    ap.add_argument("--skip-micro", action="store_true")
    ap.add_argument("--save-mb", type=int, default=200, help="checkpoint size of the save figure; 0 skips it")
    ap.add_argument("--save-rounds", type=int, default=2)
    ap.add_argument(
        "--only", default=",".join(DEFAULT), help=f"variants to run, e.g. bare,run (of {', '.join(VARIANTS)})"
    )
    ap.add_argument("--work", type=Path, default=None, help="keep the runs here (default: a temp folder)")
    ap.add_argument("--recovery-rounds", type=int, default=2,
                    help="rounds of benchmarks/recovery_time.py (rollback in process, by restart, kill "
                    "through the standby worker and in a new process); "
                    "0 skips")  # fmt: skip
    args = ap.parse_args()
    only = [v for v in VARIANTS if v in args.only.split(",")]
    # One intra-op thread in every variant: on a small shared machine, torch's spinning
    # thread pool otherwise turns other load into tenfold step times (measured: 355 ms vs 20 ms).
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    import torch

    work_tmp = None if args.work else tempfile.TemporaryDirectory(prefix="st-overhead-")
    work = args.work or Path(work_tmp.name)  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    config = write_config(work, args.steps)
    print(f"demo job: {args.steps} steps, {args.rounds} interleaved rounds, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")  # fmt: skip
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        order = only[r % len(only) :] + only[: r % len(only)]  # rotated: no variant always runs first
        for v in order:
            out = work / f"{v.strip('+')}-{r}.json"
            if v == "run":
                results[v].append(run_cli(config, f"bench-{r}"))
            elif v == "run-serial":
                results[v].append(run_cli(config, f"serial-{r}", ("recover.standby_worker=false",)))
            else:
                results[v].append(run_bare(config, out, guard=v == "+guard"))
            last = results[v][-1]
            print(
                f"  round {r + 1} {v:<7} step {last['step_ms']:.2f} ms, first step "
                f"{last['first_step_s']:.2f} s, "
                f"wall {last['wall_s']:.2f} s",
                flush=True,
            )
    print()
    print_table(
        results,
        [("step ms", "step_ms", 2), ("first step s", "first_step_s", 2), ("GO → step 1 s", "go_to_step_s", 2),
         ("save ms", "save_ms", 1),
         ("wall s", "wall_s", 2)],
    )  # fmt: skip
    guard_us = [u for r in results["+guard"] for u in r["guard_us"]]
    if guard_us:
        print()
        print(
            f"guard in-loop µs per step (its loop hooks, {len(guard_us)} steps): median "
            f"{statistics.median(guard_us):.1f}, mean {statistics.fmean(guard_us):.1f} (gradient flow "
            f"and saves "
            f"included), target ≤ 80"
        )
        hooks: dict[str, list[float]] = {}
        for r in results["+guard"]:
            for name, us in r.get("hook_us", {}).items():
                hooks.setdefault(name, []).extend(us)
        for name, us in sorted(hooks.items()):
            print(f"  {name:<24} median {statistics.median(us):7.1f} µs a call ({len(us)} calls)")
        hf = [r["hf_save_ms"] for r in results["+guard"]]
        ours = [r["save_ms"] - r["hf_save_ms"] for r in results["+guard"]]
        print(
            f"save per checkpoint in +guard: HF's own {statistics.median(hf):.1f} ms + publish "
            f"{statistics.median(ours):.1f} ms (+{statistics.median(ours) / statistics.median(hf):.0%})"
        )
    if results["bare"] and results["run"]:
        gap = statistics.median([r["first_step_s"] for r in results["run"]]) - statistics.median(
            [r["first_step_s"] for r in results["bare"]]
        )
        print(f"run's first step after bare's: +{gap:.2f} s (target ≤ +1 s)")
    for v in ("run", "run-serial"):
        if results["bare"] and results[v]:
            # Paired within each round: the load of the moment weighs on both sides of the difference.
            gaps = [
                a["first_step_s"] - b["first_step_s"]
                for a, b in zip(results[v], results["bare"], strict=True)
            ]
            print(
                f"{v}'s first step after bare's, round by round: median {statistics.median(gaps):+.2f} s "
                f"[{min(gaps):+.2f} to {max(gaps):+.2f}]"
            )
    if not args.skip_micro:
        print()
        print(f"{'guard part (median of ' + str(args.micro_steps) + ' calls)':<58} {'µs':>8}")
        for name, us in micro(args.micro_steps).items():
            print(f"{name:<58} {us:>8.1f}")
    if args.save_mb:
        print()
        save_rounds(work, args.save_mb, args.save_rounds)
    if args.recovery_rounds:
        print()
        sys.path.insert(0, str(HERE))
        from recovery_time import measure

        measure(args.recovery_rounds, args.steps, work / "recovery")
    if work_tmp is not None:
        work_tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

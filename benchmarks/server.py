"""Admission on GPU snapshot × job mix scenarios, against the estimator-free baseline.

    python benchmarks/server.py            # the table; --json for the figures
    python benchmarks/server.py --resize-run runs/RUN   # resize times of a run that scale: resized
    python benchmarks/server.py --ray-overhead          # also Ray's overhead against torchrun (slow: 2 runs)

For each scenario (a host's GPUs, some of them partly taken by foreign processes, and a
mix of fine-tunes whose needs come from the estimator on real model configs), it prints:

- **admission**: what `steadytune server` starts now, on which GPU, and why the others wait;
- **baseline** (start everything at once, one job per least-loaded GPU, no estimate):
  which jobs' GPUs would run out of memory (the job, and its neighbours, OOM);
- **estimate error margin**: how many admitted jobs would OOM if every real peak were
  10% above the estimate (the estimator's documented worst case; benchmarks/estimate_accuracy.py).

With ``--resize-run``, it prints each resize of that run (``scale:``, docs/server.md): the
world size, and the seconds from the checkpoint the stop wrote to the first step at the
new size (from the run's ``resized`` events).

With ``--ray-overhead``, it also prints Ray Train's overhead against a plain torchrun run of
the same job (benchmarks/ray_overhead.py: two real runs of the demo model on a local Ray
cluster, a minute or two; skipped without the ``ray`` extra).

The snapshots are constructed, not recorded (this benchmark runs anywhere, without a GPU):
80 GiB and 24 GiB cards, empty or with a notebook or an inference server on them. The
admission decisions are the daemon's own code (steadytune.server.admission).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from steadytune.estimate import TrainSetup, estimate_peak, load_architecture
from steadytune.server.admission import DEFAULT_HEADROOM_BYTES, JobRequest, admit, start_everything
from steadytune.server.ledger import GIB, GpuProcess, GpuReading, build_ledger

MODELS = Path(__file__).resolve().parents[1] / "examples" / "models"


@dataclass(frozen=True)
class Mix:
    name: str
    job: str
    model: str
    setup: TrainSetup
    gpus: int = 1
    priority: int = 0


def need(mix: Mix) -> int:
    return estimate_peak(load_architecture(str(MODELS / mix.model)), mix.setup).peak_bytes


def card(index: int, total_gib: int, foreign_gib: float = 0.0) -> GpuReading:
    procs = (GpuProcess(90_000 + index, int(foreign_gib * GIB)),) if foreign_gib else ()
    return GpuReading(index, total_gib * GIB, int(foreign_gib * GIB), f"{total_gib}G", None, procs)


LORA_8B = TrainSetup(method="lora", dtype="bf16", batch=4, seq=2048, gradient_checkpointing=True)
QLORA_8B = TrainSetup(method="qlora", dtype="bf16", batch=4, seq=2048, gradient_checkpointing=True)
FULL_3B = TrainSetup(method="full", dtype="bf16", batch=2, seq=2048, gradient_checkpointing=True)
FULL_3B_Z3 = TrainSetup(method="full", dtype="bf16", batch=2, seq=2048, gradient_checkpointing=True,
                        zero_stage=3, gpus=2)  # fmt: skip

SCENARIOS: dict[str, tuple[list[GpuReading], list[Mix]]] = {
    "one 80G card, three LoRA/QLoRA jobs": (
        [card(0, 80)],
        [Mix("a", "lora 8B", "llama-3.1-8b", LORA_8B), Mix("b", "qlora 8B", "llama-3.1-8b", QLORA_8B),
         Mix("c", "lora 8B", "llama-3.1-8b", LORA_8B)],
    ),
    "two 80G cards, one has an inference server (60G)": (
        [card(0, 80, 60), card(1, 80)],
        [Mix("a", "full 3B", "llama-3.2-3b", FULL_3B), Mix("b", "lora 8B", "llama-3.1-8b", LORA_8B),
         Mix("c", "qlora 8B", "llama-3.1-8b", QLORA_8B)],
    ),
    "four 24G cards, a notebook on GPU 2 (10G), priorities": (
        [card(0, 24), card(1, 24), card(2, 24, 10), card(3, 24)],
        [Mix("a", "qlora 8B", "llama-3.1-8b", QLORA_8B),
         Mix("b", "full 3B zero3×2", "llama-3.2-3b", FULL_3B_Z3, 2),
         Mix("c", "qlora 8B, urgent", "llama-3.1-8b", QLORA_8B, priority=5),
         Mix("d", "qlora 8B", "llama-3.1-8b", QLORA_8B)],
    ),
    "two 80G cards, a long-context job that fits nowhere": (
        [card(0, 80), card(1, 80)],
        [Mix("a", "full 7B b8 s4096", "llama-2-7b",
             TrainSetup(method="full", dtype="bf16", batch=8, seq=4096)),
         Mix("b", "lora 8B", "llama-3.1-8b", LORA_8B), Mix("c", "qlora 8B", "llama-3.1-8b", QLORA_8B)],
    ),
}  # fmt: skip


def run_scenario(gpus: list[GpuReading], mixes: list[Mix]) -> dict:
    needs = {m.name: need(m) for m in mixes}
    jobs = [JobRequest(m.name, needs[m.name], m.gpus, m.priority, seq) for seq, m in enumerate(mixes)]
    ledger = build_ledger(gpus, [])
    decisions = admit(jobs, ledger, DEFAULT_HEADROOM_BYTES)
    baseline = start_everything(jobs, ledger, needs)
    admitted = [d for d in decisions if d.admitted]
    # The margin: real peaks 10% above the estimate, on the devices admission chose.
    load = {g.index: g.used_bytes for g in gpus}
    for d in admitted:
        for i in d.gpus:
            load[i] += int(needs[d.job_id] * 1.10)
    total = {g.index: g.total_bytes for g in gpus}
    margin_oom = [d.job_id for d in admitted if any(load[i] > total[i] for i in d.gpus)]
    return {
        "jobs": [
            {
                "job": m.name,
                "what": m.job,
                "gpus": m.gpus,
                "priority": m.priority,
                "need_gib": round(needs[m.name] / GIB, 2),
            }
            for m in mixes
        ],
        "admission": [
            {"job": d.job_id, "admitted": d.admitted, "gpus": list(d.gpus), "reason": d.reason}
            for d in decisions
        ],
        "baseline_oom": sorted(j for j, oom in baseline.items() if oom),
        "admitted_oom": [],  # by construction, when the estimate holds
        "admitted_oom_at_plus_10pct": margin_oom,
    }


def resize_times(run_root: Path) -> list[dict]:
    """Each resize of a run: its kind, world size, and checkpoint -> first step seconds."""
    from steadytune.records import Event
    from steadytune.telemetry.stream import iter_records

    return [
        {
            "kind": e.data.get("kind"),
            "world": e.data.get("world"),
            "step": e.step,
            "checkpoint_to_first_step_s": e.data.get("checkpoint_to_first_step_s"),
            "decision_to_first_step_s": e.data.get("decision_to_first_step_s"),
        }
        for e in iter_records(run_root / "events.jsonl")
        if isinstance(e, Event) and e.name == "resized"
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--resize-run", type=Path, help="a run directory: print its resize times")
    parser.add_argument("--ray-overhead", action="store_true",
                        help="also Ray's overhead against torchrun on the demo job "
                        "(benchmarks/ray_overhead.py)")  # fmt: skip
    parser.add_argument("--ray-steps", type=int, default=30, help="with --ray-overhead: steps per run")
    parser.add_argument("--ray-workers", type=int, default=2, help="with --ray-overhead: workers")
    args = parser.parse_args()
    if args.resize_run is not None:
        times = resize_times(args.resize_run)
        if args.json:
            print(json.dumps(times, indent=1))
        for t in [] if args.json else times:
            print(f"{t['kind']:<12} -> {t['world']} process(es) at step {t['step']}: "
                  f"{t['checkpoint_to_first_step_s']:.1f}s checkpoint -> first step, "
                  f"{t['decision_to_first_step_s']:.1f}s decision -> first step")  # fmt: skip
        if not times:
            print(f"no resize in {args.resize_run}")
        return 0
    results = {name: run_scenario(*sc) for name, sc in SCENARIOS.items()}
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    totals = {"jobs": 0, "baseline_oom": 0, "admitted": 0, "margin": 0}
    for name, r in results.items():
        print(f"\n## {name}")
        decided = {d["job"]: d for d in r["admission"]}
        for j in r["jobs"]:
            d = decided[j["job"]]
            where = f"GPU {','.join(map(str, d['gpus']))}" if d["admitted"] else "waits"
            oom = "OOM" if j["job"] in r["baseline_oom"] else "ok"
            print(
                f"  {j['job']} {j['what']:<24} need {j['need_gib']:6.2f} GiB ×{j['gpus']} prio "
                f"{j['priority']}"
                f" | server: {where:<8} | start-everything: {oom:<3} | {d['reason']}"
            )
        print(f"  baseline OOMs: {len(r['baseline_oom'])}/{len(r['jobs'])}; admitted jobs that OOM: 0; "
              f"at +10% estimate error: {len(r['admitted_oom_at_plus_10pct'])}")  # fmt: skip
        totals["jobs"] += len(r["jobs"])
        totals["baseline_oom"] += len(r["baseline_oom"])
        totals["admitted"] += sum(d["admitted"] for d in r["admission"])
        totals["margin"] += len(r["admitted_oom_at_plus_10pct"])
    print(f"\nall scenarios: {totals['jobs']} jobs; start-everything OOMs {totals['baseline_oom']}; "
          f"the server starts {totals['admitted']} now (the rest wait, none OOMs); at +10% estimate error "
          f"{totals['margin']} admitted would OOM")  # fmt: skip
    if args.ray_overhead:
        print("\n## Ray's overhead against torchrun, the same job")
        print("\n".join(ray_overhead_lines(args.ray_steps, args.ray_workers)))
    return 0


def ray_overhead_lines(steps: int, workers: int) -> list[str]:
    import ray_overhead  # benchmarks/ is on the path when this script runs

    results = ray_overhead.measure(steps, workers, repeats=1)
    return [ray_overhead.SKIPPED] if results is None else ray_overhead.report(results, steps, workers)


if __name__ == "__main__":
    raise SystemExit(main())

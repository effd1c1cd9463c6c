"""Ray Train's overhead against torchrun, on the same supervised job, side by side.

    python benchmarks/ray_overhead.py [--steps 30] [--workers 2] [--repeats 1]

Trains the demo model with ``steadytune run`` twice per repeat, the same config and seed:
``run.nproc_per_node: N`` (torchrun on this host, gloo on CPU) and ``run.engine: ray`` with
``ray.num_workers: N`` on a local Ray cluster of N one-CPU nodes (``ray.cluster_utils.Cluster``;
its start is not counted). Each run is timed from the launch to the supervisor's exit, to the
first step record, and per step (the median interval between rank 0's step records after
the first). The overhead is Ray's start (joining, placing the group, the controller) and any
per-step cost of reporting through Ray; the training itself is the same code.

target: none; it is reported. On a real multi-node cluster the start is the part that grows.
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
from pathlib import Path
from typing import Any

import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
SKIPPED = "skipped: Ray is not installed (pip install 'steadytune[ray]')"


def config(tmp: Path, assets: Path, steps: int, engine: dict[str, Any]) -> Path:
    cfg = {
        "model": {"name_or_path": str(assets / "model")},
        "method": "full",
        "data": {"train_file": str(assets / "train.jsonl"), "max_seq_length": 96},
        "train": {"learning_rate": 3e-3, "per_device_train_batch_size": 4, "max_steps": steps,
                  "save_steps": steps, "logging_steps": 1, "seed": 0},
        "run": {"runs_dir": str(tmp / "runs"), **engine.get("run", {})},
        **({"ray": engine["ray"]} if "ray" in engine else {}),
    }  # fmt: skip
    path = tmp / f"{engine['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def timed_run(cfg: Path, run_id: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    t0 = time.time()
    out = subprocess.run(
        [sys.executable, "-m", "steadytune.cli.main", "run", str(cfg), "--run-id", run_id,
         "--quiet", "--skip-check"],
        capture_output=True, text=True, env=env, cwd=cfg.parent, timeout=1800,
    )  # fmt: skip
    wall = time.time() - t0
    if out.returncode != 0:
        raise SystemExit(f"{run_id} failed ({out.returncode}):\n{out.stdout[-3000:]}")
    stream = cfg.parent / "runs" / run_id / "telemetry" / "rank-0.jsonl"
    ts = [r["ts"] for r in map(json.loads, stream.read_text().splitlines()) if r.get("type") == "step"]
    gaps = [b - a for a, b in itertools.pairwise(ts)]
    return {
        "wall_s": wall,
        "first_step_s": ts[0] - t0,
        "step_s": statistics.median(gaps) if gaps else float("nan"),
    }


def measure(steps: int, workers: int, repeats: int) -> dict[str, list[dict[str, float]]] | None:
    """Each engine's timings, run interleaved; None when Ray is not installed."""
    try:
        from ray.cluster_utils import Cluster
    except ImportError:
        return None
    from steadytune.train.assets import ensure_demo_assets

    assets = ensure_demo_assets()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(workers):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    results: dict[str, list[dict[str, float]]] = {"torchrun": [], "ray": []}
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            engines = {
                "torchrun": {"name": "torchrun", "run": {"nproc_per_node": workers}},
                "ray": {"name": "ray", "run": {"engine": "ray"},
                        "ray": {"address": cluster.address, "num_workers": workers,
                                "resources_per_worker": {"CPU": 1}}},
            }  # fmt: skip
            for i in range(repeats):
                for name, engine in engines.items():  # interleaved, so a busy moment hits both
                    results[name].append(timed_run(config(tmp, assets, steps, engine), f"{name}-{i}"))
    finally:
        cluster.shutdown()
    return results


def report(results: dict[str, list[dict[str, float]]], steps: int, workers: int) -> list[str]:
    """The medians side by side, as printed."""

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    repeats = len(results["ray"])
    lines = [f"{steps} steps, {workers} workers (gloo, CPU), demo model, {repeats} repeat(s); medians",
             f"{'':24}{'torchrun':>12}{'ray':>12}{'ray - torchrun':>16}"]  # fmt: skip
    for key, label in (("wall_s", "launch → exit (s)"), ("first_step_s", "launch → first step (s)"),
                       ("step_s", "step (s)")):  # fmt: skip
        a, b = med("torchrun", key), med("ray", key)
        lines.append(f"{label:24}{a:12.2f}{b:12.2f}{b - a:+16.2f}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    results = measure(args.steps, args.workers, args.repeats)
    if results is None:
        print(SKIPPED)
        return 0
    print("\n".join(report(results, args.steps, args.workers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

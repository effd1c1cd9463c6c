"""Command lines for the plain HF Trainer example script, and for `steadytune supervise` around a job.

One place builds them, so every test that runs the script (bare, injected, drilled or
supervised) and every tool run under `supervise` starts it the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from .runs import STEADYTUNE

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "hf_trainer_script.py"


def hf_script(demo_assets: Path, out: Path | str, *args: str, python: str = sys.executable) -> list[str]:
    """`python hf_trainer_script.py` on the demo model and data, writing to ``out``; ``args`` are more of
    its flags. ``out`` may be a placeholder (``{output_dir}``) that a drill fills in."""
    return [python, str(SCRIPT), "--output_dir", str(out), "--model", str(demo_assets / "model"),
            "--data", str(demo_assets / "train.jsonl"), *args]  # fmt: skip


def hf_job(
    demo_assets: Path, out: Path | str, steps: int, sleep: float, *extra: str, save_steps: int = 10
) -> list[str]:
    """The script for ``steps`` steps, a checkpoint every ``save_steps``, ``sleep`` seconds per step."""
    return hf_script(demo_assets, out, "--max_steps", str(steps), "--save_steps", str(save_steps),
                     "--step_sleep", str(sleep), *extra)  # fmt: skip


def supervise_cmd(job: Sequence[str], out: Path, runs: Path, run_id: str, *options: str) -> list[str]:
    """`steadytune supervise OPTIONS -- JOB`: the job checkpoints into ``out``, the run is ``runs/run_id``."""
    return [STEADYTUNE, "supervise", "--output-dir", str(out), "--runs-dir", str(runs), "--run-id", run_id,
            *options, "--", *job]  # fmt: skip


def supervise_hf(
    tmp: Path, demo_assets: Path, steps: int, sleep: float, *options: str, run_id: str = "ext"
) -> list[str]:
    """`steadytune supervise OPTIONS --` the script, its checkpoints in ``tmp/out``, its run in
    ``tmp/runs/run_id``."""
    out = tmp / "out"
    return supervise_cmd(hf_job(demo_assets, out, steps, sleep), out, tmp / "runs", run_id, *options)

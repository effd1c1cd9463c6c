"""The shipped example configs run on the demo model; torchrun runs write every rank's stream."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from steadytune.checkpoint.manifest import verify
from steadytune.checkpoint.store import read_pointer
from steadytune.records import StepRecord
from steadytune.telemetry.stream import iter_records

from .runs import STEADYTUNE, run_dir, steps, write_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def run_example(name: str, tmp_path: Path, assets: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            STEADYTUNE,
            "run",
            str(REPO / "examples" / name),
            "--run-id",
            name.split(".")[0],
            "--quiet",
            f"model.name_or_path={assets / 'model'}",
            f"data.train_file={assets / 'train.jsonl'}",
            f"data.eval_file={assets / 'eval.jsonl'}",
            f"run.runs_dir={tmp_path / 'runs'}",
            *overrides,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("example", ["lora.yaml", "qlora.yaml"])
def test_example_config_completes(example: str, tmp_path: Path, demo_assets: Path) -> None:
    proc = run_example(
        example, tmp_path, demo_assets, "train.max_steps=12", "train.save_steps=6", "train.eval_steps=6"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = run_dir(tmp_path / "x.yaml", example.split(".")[0])
    records = steps(run)
    assert [r.step for r in records] == list(range(1, 13))
    latest = read_pointer(run.latest_pointer)
    assert latest is not None and verify(latest).ok
    assert (latest / "adapter_model.safetensors").exists()  # PEFT checkpoints hold the adapter
    if example == "qlora.yaml":
        log = (run.logs / "worker-0.log").read_text()
        assert "Traceback" not in log
        cfg = (run.root / "final" / "adapter_config.json").read_text()
        assert "lora" in cfg.lower()


def test_validate_accepts_the_examples(demo_assets: Path) -> None:
    for example in ("lora.yaml", "qlora.yaml", "full.yaml", "ddp.yaml", "ray.yaml"):
        proc = subprocess.run(
            [
                STEADYTUNE,
                "validate",
                str(REPO / "examples" / example),
                f"model.name_or_path={demo_assets / 'model'}",
                f"data.train_file={demo_assets / 'train.jsonl'}",
                f"data.eval_file={demo_assets / 'eval.jsonl'}",
            ],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, (example, proc.stderr)
        assert "OK" in proc.stdout


@pytest.mark.serial  # two training processes at once: kept off the other heavy tests
def test_torchrun_two_processes_write_both_ranks(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(
        tmp_path,
        demo_assets,
        train={"max_steps": 8, "save_steps": 4, "per_device_train_batch_size": 2},
        run={"nproc_per_node": 2},
    )
    proc = subprocess.run(
        [STEADYTUNE, "run", str(cfg), "--run-id", "ddp", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = run_dir(cfg, "ddp")
    for rank in (0, 1):
        recs = [r for r in iter_records(run.telemetry(rank)) if isinstance(r, StepRecord)]
        assert [r.step for r in recs] == list(range(1, 9)), rank
        assert all(r.rank == rank for r in recs)
    # Each rank saw different samples: the distributed sampler split the data.
    r0 = {i for r in steps(run, 0) for i in r.batch.indices}
    r1 = {i for r in steps(run, 1) for i in r.batch.indices}
    assert r0 and r1 and not (r0 & r1)
    latest = read_pointer(run.latest_pointer)
    assert verify(latest).ok and (latest / "rng_state_1.pth").exists()


def test_plain_loop_guard_skips_the_nan_update(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "plain_loop.py"), str(tmp_path / "loop")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    recs = [
        r for r in iter_records(tmp_path / "loop" / "telemetry" / "rank-0.jsonl") if isinstance(r, StepRecord)
    ]
    assert len(recs) == 60
    assert [r.step for r in recs if r.skipped] == [30]


def test_nan_guard_leaves_weights_bit_identical(tmp_path: Path) -> None:
    from steadytune import Guard

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    guard = Guard(tmp_path / "g")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    guard.begin_step()
    loss = model(torch.randn(3, 4)).sum() * float("inf")
    loss.backward()
    guard.add_microbatch(loss)
    assert guard.before_update(model, opt) is False
    opt.step()
    rec = guard.end_step(1)
    assert rec.skipped and rec.loss != rec.loss  # NaN recorded, not hidden
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k

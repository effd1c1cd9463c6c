"""benchmarks/gpu_check.py: its dry run on CPU (so it cannot rot), and the real thing on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
NUMBERS = [1, 2, 3, 4, 5, 6, 7]


def run_check(out: Path, cache: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STEADYTUNE_CACHE": str(cache), "STEADYTUNE_DATA_CACHE": str(cache / "data")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


def read_report(out: Path) -> dict:
    assert (out / "gpu_check.json").is_file() and (out / "gpu_check.md").is_file()
    return json.loads((out / "gpu_check.json").read_text())


@pytest.mark.slow
def test_dry_run_executes_every_step_and_fails_none(
    tmp_path: Path, cache_dir: Path, demo_assets: Path
) -> None:
    out = tmp_path / "out"
    proc = run_check(out, cache_dir, "--dry-run", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = read_report(out)
    assert report["mode"] == "dry-run" and report["ran_on_gpu"] is False
    assert "not a GPU result" in report["notice"]
    checks = {c["number"]: c for c in report["checks"]}
    assert [n for n in NUMBERS if n in checks] == NUMBERS
    for c in report["checks"]:
        assert c["status"] in ("pass", "skipped"), (c["name"], c["assertions"])
        if c["status"] == "skipped":
            assert c["reason"], c["name"]
        for a in c["assertions"]:
            assert a["status"] != "fail", (c["name"], a)
            if a["status"] == "skipped":
                assert a["reason"], (c["name"], a)
    # Every step really ran on CPU: checks 1-7 each passed something of their own.
    for n in NUMBERS:
        assert checks[n]["status"] == "pass", checks[n]
        assert any(a["status"] == "skipped" for a in checks[n]["assertions"]), f"check {n}: no CUDA assertion"
    later = {a["name"]: a for a in checks[6]["assertions"]}
    # quant-check ran int8 and NF4 for real; fp8 says why it could not.
    assert later["int8 stays closer to the reference than NF4 (mean KL)"]["status"] == "pass"
    assert "compute capability" in later["fp8 skipped with its reason"]["detail"]
    assert later["fp8 (torchao) measured on the GPU"]["status"] == "skipped"
    assert set(checks[6]["figures"]["quant"]["candidates"]) == {"int8", "nf4"}
    # The ledger step started its three holders for real; what only NVML can tell is skipped.
    assert all(later[f"{n} holds its memory"]["status"] == "pass" for n in ("job-a", "job-b", "foreign"))
    assert later["NVML lists the three processes on GPU 0 by their pids"]["status"] == "skipped"
    # unsloth: the same supervise line, kill and resume, with transformers and peft standing in for it.
    unsloth = {a["name"]: a for a in checks[7]["assertions"]}
    assert unsloth["one restart, resuming checkpoint-10"]["status"] == "pass"
    assert unsloth["unsloth imports"]["status"] == "skipped"
    assert "unsloth needs a CUDA device" in unsloth["the trainer the guard sits in is unsloth's"]["reason"]
    cleanup = next(c for c in report["checks"] if c["name"] == "cleanup")
    assert cleanup["status"] == "pass"
    md = (out / "gpu_check.md").read_text()
    assert "DRY RUN ON CPU: this is not a GPU result" in md
    assert "- skipped: NVML lists the three processes on GPU 0 by their pids" in md
    assert "- skipped: fp8 (torchao) measured on the GPU" in md
    assert len(report["checks"][2]["figures"]["cases"]) == 13  # full/LoRA/QLoRA x 2 sizes x 2 models + 1


def test_without_cuda_and_without_dry_run_it_refuses(tmp_path: Path, cache_dir: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the real run is test_on_a_gpu_no_check_fails")
    proc = run_check(tmp_path / "out", cache_dir, timeout=120)
    assert proc.returncode == 2 and "--dry-run" in proc.stderr
    assert not (tmp_path / "out" / "gpu_check.json").exists()


@pytest.mark.gpu
@pytest.mark.slow
def test_on_a_gpu_no_check_fails(tmp_path: Path, cache_dir: Path, demo_assets: Path) -> None:
    out = tmp_path / "out"
    proc = run_check(out, cache_dir, timeout=540)
    report = read_report(out)
    failed = [(c["name"], [a for a in c["assertions"] if a["status"] == "fail"]) for c in report["checks"]
              if c["status"] == "fail"]  # fmt: skip
    assert proc.returncode == 0 and not failed, failed
    assert report["ran_on_gpu"] is True and report["wall_s"] < 480

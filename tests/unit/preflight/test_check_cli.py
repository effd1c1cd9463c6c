"""``steadytune check`` without the dataset scan: exit codes, JSON contract, no torch import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.cli.main import main
from steadytune.preflight import run_preflight
from steadytune.preflight.probe import GpuInfo
from tests.fresh import fresh_imports

from .conftest import GiB, host, make_config

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = str(REPO / "examples" / "check-llama-3.1-8b.yaml")


def check_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(["check", *args, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_8b_example_plans_for_80gib_as_go_and_24gib_as_no_go(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEADYTUNE_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # runs_dir: runs, relative to the working directory
    code, report = check_json(capsys, EXAMPLE, "--device-memory", "80GiB", "--no-data")
    assert code == 0 and report["verdict"] == "go" and report["device"] == "cuda"
    assert set(report) == {"verdict", "go", "device", "config", "counts", "checks", "recommendation"}
    rec = report["recommendation"]
    assert rec["per_device_train_batch_size"] * rec["gradient_accumulation_steps"] == 16
    code, report = check_json(capsys, EXAMPLE, "--device-memory", "24GiB", "--no-data")
    assert code == 1 and report["verdict"] == "no-go"
    (mem,) = [c for c in report["checks"] if c["name"] == "device_memory"]
    assert mem["status"] == "fail" and mem["fix"]
    rec = report["recommendation"]
    assert rec["gradient_checkpointing"] is True
    assert rec["per_device_train_batch_size"] * rec["gradient_accumulation_steps"] == 16


def test_the_check_stays_torch_free(tmp_path: Path) -> None:
    """The estimate and every check without the data scan, in a fresh interpreter (see tests/fresh.py)."""
    code = (
        f"import os\nos.chdir({str(tmp_path)!r})\nos.environ['STEADYTUNE_CACHE'] = {str(tmp_path)!r}\n"
        "from steadytune.cli.main import main\n"
        f"assert main(['check', {EXAMPLE!r}, '--device-memory', '80GiB', '--no-data', '--format', "
        f"'json']) == 0\n"
        f"assert main(['check', {EXAMPLE!r}, '--device-memory', '24GiB', '--no-data']) == 1\n"
    )
    assert fresh_imports(code) == []


def test_config_errors_exit_2_and_cross_key_problems_are_failed_checks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out = check_json(capsys, EXAMPLE, "train.learning_rate=-1", "--no-data")
    assert code == 2 and out["verdict"] == "config-error" and out["issues"][0]["key"] == "train.learning_rate"
    code, report = check_json(
        capsys,
        EXAMPLE,
        "train.save_steps=500",
        f"run.runs_dir={tmp_path}",
        "--device-memory",
        "80GiB",
        "--no-data",
    )
    assert code == 1
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["config_train_save_steps"]
    assert "max_steps=200" in failed[0]["reason"]


def test_bad_option_values_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", EXAMPLE, "--headroom", "lots"]) == 2
    assert "memory size" in capsys.readouterr().err


def test_text_output_has_the_table_the_recommendation_and_the_verdict(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["check", EXAMPLE, f"run.runs_dir={tmp_path}", "--device-memory", "24GiB", "--no-data"])
    out = capsys.readouterr().out
    assert code == 1
    for text in ("✗", "memory/device_memory", "recommended:", "gradient_checkpointing: true", "NO-GO"):
        assert text in out


def test_preflight_on_a_fake_gpu_host(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((REPO / "examples/models/llama-3.2-3b/config.json").read_text())
    cfg = make_config(
        tmp_path,
        data={"max_seq_length": 1024},
        train={"bf16": True, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2},
        model={"dtype": "bfloat16"},
    )
    gpus = (GpuInfo(0, "L4", 22 * GiB, 24 * GiB, ()),)
    report = run_preflight(cfg, facts=host(gpus=gpus), scan=False, env={})
    assert report.device == "cuda" and report.go
    assert report.find("gpu_processes")[0].status == "ok"
    small = run_preflight(
        cfg, facts=host(gpus=(GpuInfo(0, "T4", 6 * GiB, 16 * GiB, ()),)), scan=False, env={}
    )
    assert not small.go and small.find("device_memory")[0].status == "fail"

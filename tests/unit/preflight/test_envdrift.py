"""check's environment warning: against env.json of the last completed run of the same config."""

from __future__ import annotations

import copy
import importlib.metadata
import json
from pathlib import Path

from steadytune.config.load import dump_config
from steadytune.preflight.envdrift import environment_check
from steadytune.rundir import RunDir
from steadytune.telemetry.runenv import run_env, write_env

from .conftest import make_config

NOW = run_env(clock=lambda: 1.0)  # this interpreter, read for real once


def past_run(runs: Path, run_id: str, config_text: str, state: str, when: float, env: dict) -> RunDir:
    run = RunDir(runs / run_id).create()
    run.config.write_text(config_text)
    run.status.write_text(json.dumps({"state": state, "updated_ts": when}))
    write_env(run, env)
    return run


def with_version(env: dict, name: str, version: str) -> dict:
    out = copy.deepcopy(env)
    out["packages"] = [p for p in out["packages"] if p.split("==")[0].lower() != name] + [
        f"{name}=={version}"
    ]
    return out


def test_no_completed_run_is_not_judged(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    past_run(tmp_path / "runs", "r1", dump_config(cfg), "failed", 5.0, with_version(NOW, "torch", "1.0"))
    c = environment_check(cfg, current=lambda: NOW)
    assert c.status == "na" and "no completed run" in c.reason


def test_the_same_environment_is_ok(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    past_run(tmp_path / "runs", "r1", dump_config(cfg), "completed", 5.0, NOW)
    c = environment_check(cfg, current=lambda: NOW)
    assert c.status == "ok" and "r1" in c.reason


def test_a_change_is_a_warning_naming_each_package_against_the_newest_completed_run(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    text, runs = dump_config(cfg), tmp_path / "runs"
    torch_now = importlib.metadata.version("torch")
    past_run(runs, "older", text, "completed", 5.0, with_version(NOW, "peft", "0.1.0"))
    past_run(runs, "newer", text, "completed", 9.0, with_version(NOW, "torch", "2.0.0"))
    past_run(runs, "newest-failed", text, "failed", 20.0, with_version(NOW, "numpy", "1.0"))
    other = make_config(tmp_path, train={"max_steps": 7})
    past_run(runs, "other-config", dump_config(other), "completed", 30.0, with_version(NOW, "rich", "1.0"))
    c = environment_check(cfg, current=lambda: NOW)
    assert c.status == "warn" and c.data["run"] == "newer"
    assert f"torch 2.0.0 → {torch_now}" in c.reason and "peft" not in c.reason and "rich" not in c.reason
    assert c.data["changed"] == {"torch": ["2.0.0", torch_now]}
    assert "steadytune env export" in c.fix and str(runs / "newer") in c.fix


def test_a_named_config_matches_by_its_run_name(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, run={"name": "llama-sft"})
    edited = make_config(tmp_path, run={"name": "llama-sft"}, train={"max_steps": 500})
    past_run(
        tmp_path / "runs", "a", dump_config(edited), "completed", 5.0, with_version(NOW, "zzz-extra", "1")
    )
    c = environment_check(cfg, current=lambda: NOW)
    assert c.status == "warn" and "-zzz-extra 1" in c.reason

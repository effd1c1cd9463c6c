"""env.json read back: the diff of two environments, the pinned export, the snapshot of another Python."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import sys
import venv
from pathlib import Path

from packaging.requirements import Requirement

from steadytune.cli.main import main
from steadytune.forensics.envdiff import diff_envs, render_diff, requirements
from steadytune.rundir import RunDir
from steadytune.telemetry.runenv import (
    add_worker_details,
    command_python,
    read_run_env,
    run_env,
    write_command_env,
    write_run_env,
)


def this_env() -> dict:
    return run_env(clock=lambda: 1.0)


def with_packages(env: dict, **changes: str | None) -> dict:
    """``env`` with packages set to a version (or removed with None): a second interpreter, on paper."""
    out = copy.deepcopy(env)
    pkgs = {p.split("==")[0].lower(): p for p in out["packages"]}
    for name, version in changes.items():
        pkgs.pop(name, None)
        if version is not None:
            pkgs[name] = f"{name}=={version}"
    out["packages"] = sorted(pkgs.values())
    return out


def test_the_diff_names_added_removed_and_changed_packages_key_ones_first() -> None:
    a = this_env()
    torch_v = importlib.metadata.version("torch")
    b = with_packages(a, torch="9.9.9", zzz_new="1.0", pyyaml=None)
    b["git"] = {"commit": "b" * 40}
    d = diff_envs(a, b)
    assert d.changed == {"torch": (torch_v, "9.9.9")}
    assert d.added == {"zzz_new": "1.0"}
    assert list(d.removed) == ["PyYAML"]
    assert d.git["commit"] == (None, "b" * 40)
    text = render_diff(d, "a", "b")
    assert f"~ torch {torch_v} → 9.9.9" in text and "+ zzz_new==1.0" in text and "- PyYAML==" in text
    assert diff_envs(a, copy.deepcopy(a)).same


def test_the_export_is_a_requirements_file_pip_can_parse_pinning_every_package() -> None:
    env = this_env()
    env["local_packages"] = {"pyyaml": "editable file:///src/pyyaml"}
    text = requirements(env, "runs/x/env.json")
    pins = [line for line in text.splitlines() if line and not line.startswith(("#", "--"))]
    reqs = [Requirement(line) for line in pins]
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in reqs)
    assert {r.name.lower() for r in reqs} == {p.split("==")[0].lower() for p in env["packages"]} - {"pyyaml"}
    assert "# PyYAML==" in text and "editable file:///src/pyyaml" in text  # a local install is no pin


def test_the_worker_adds_torch_readings_once(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r").create()
    write_run_env(run, [tmp_path])
    add_worker_details(run, rank=1, attempt=0)
    add_worker_details(run, rank=0, attempt=1)
    assert "read_by" not in read_run_env(run)["torch"]  # neither another rank nor a restart writes
    add_worker_details(run, rank=0, attempt=0)
    env = read_run_env(run)
    import torch

    assert env["torch"]["torch"] == torch.__version__ and env["torch"]["read_by"] == "worker"
    assert {"cuda_build", "cudnn", "nccl", "cuda_available"} <= env["torch"].keys()
    assert env["written_by"] == "supervisor" and env["git"] is None
    assert not list(run.root.glob(".env.json.*"))  # atomic writes leave no temp file


def test_the_interpreter_of_a_command(tmp_path: Path) -> None:
    assert command_python([sys.executable, "train.py"]) == sys.executable
    script = tmp_path / "launch"
    script.write_text(f"#!{sys.executable}\nprint(1)\n")
    script.chmod(0o755)
    assert command_python([str(script), "--x"]) == sys.executable
    assert command_python(["bash", "-c", "true"]) is None
    assert command_python([]) is None


def test_a_supervised_commands_own_interpreter_is_read(tmp_path: Path, capsys) -> None:
    # A bare venv is another interpreter with no packages at all: what it reports is its own, not ours.
    venv.create(tmp_path / "venv", with_pip=False, symlinks=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    a, b = RunDir(tmp_path / "a").create(), RunDir(tmp_path / "b").create()
    for run in (a, b):
        run.config.write_text("model: {}\n")
    write_run_env(a)
    write_command_env(b, [python, "train.py"], cwd=tmp_path)
    env_b = read_run_env(b)
    assert env_b["written_by"] == "supervise" and env_b["command"]["interpreter"] == python
    assert env_b["command"]["packages"] == [] and env_b["command"]["python"]["executable"] == python
    assert env_b["packages"] == read_run_env(a)["packages"]  # the supervisor's own, kept beside it
    assert main(["env", "diff", str(a.root), str(b.root), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert "PyYAML" in d["packages"]["removed"] and d["packages"]["added"] == {}
    write_command_env(b, ["bash", "run.sh"], cwd=tmp_path)
    assert read_run_env(b)["command"] == {
        "interpreter": None,
        "error": "the command's Python interpreter could not be told from it",
    }


def test_env_cli_errors_name_the_fix(tmp_path: Path, capsys) -> None:
    run = RunDir(tmp_path / "old").create()
    run.config.write_text("model: {}\n")
    assert main(["env", str(run.root)]) == 1
    assert "has no env.json" in capsys.readouterr().err
    assert main(["env", "diff", str(run.root)]) == 2
    assert "two runs" in capsys.readouterr().err
    write_run_env(run)
    out = tmp_path / "req.txt"
    out.write_text("keep me\n")
    assert main(["env", "export", str(run.root), "-o", str(out)]) == 2
    assert out.read_text() == "keep me\n" and "--force" in capsys.readouterr().err
    assert main(["env", "export", str(run.root), "-o", str(out), "--force"]) == 0
    assert "==" in out.read_text()

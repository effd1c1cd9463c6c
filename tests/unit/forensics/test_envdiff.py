"""env.json read back: the diff of two environments, the pinned export, the snapshot of another Python."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

from packaging.requirements import Requirement

from steadytune.cli.main import main
from steadytune.forensics.envdiff import diff_envs, render_diff, requirements
from steadytune.rundir import RunDir
from steadytune.telemetry import envsnap
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


def test_a_commands_torch_is_read_from_its_files_never_imported(tmp_path: Path) -> None:
    # A torch whose import fails loudly, on the path ahead of the real one: the snapshot script must
    # read its build from version.py and its version from its metadata without executing it.
    pkg = tmp_path / "site" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('torch was imported')\n")
    (pkg / "version.py").write_text(
        "from typing import Optional\n__version__ = '9.1.0+cu128'\ndebug = False\n"
        "cuda: Optional[str] = '12.8'\ngit_version = 'abc123'\nhip: Optional[str] = None\n"
    )
    meta = tmp_path / "site" / "torch-9.1.0+cu128.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 9.1.0+cu128\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    done = subprocess.run(
        [sys.executable, envsnap.__file__, "--no-torch"], capture_output=True, text=True, env=env, check=True
    )
    torch = json.loads(done.stdout)["torch"]
    assert torch == {
        "torch": "9.1.0+cu128",
        "cuda_build": "12.8",
        "hip_build": None,
        "git_version": "abc123",
        "read_from": "files",
    }
    broken = pkg / "version.py"
    broken.write_bytes(b"\xff\xfe not text")
    done = subprocess.run(
        [sys.executable, envsnap.__file__, "--no-torch"], capture_output=True, text=True, env=env, check=True
    )
    assert json.loads(done.stdout)["torch"] == {"torch": "9.1.0+cu128"}  # unreadable: the version alone


def test_an_injected_commands_rank_0_adds_torch_to_the_commands_half(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r").create()
    write_command_env(run, [sys.executable, "train.py"], cwd=tmp_path)
    before = read_run_env(run)
    assert before["command"]["torch"]["read_from"] == "files" and "cudnn" not in before["command"]["torch"]
    top = before["torch"]
    add_worker_details(run, rank=0, attempt=0)
    env = read_run_env(run)
    import torch

    read = env["command"]["torch"]
    assert read["read_by"] == "worker" and read["torch"] == torch.__version__
    assert {"cudnn", "nccl", "cuda_available", "git_version"} <= read.keys()
    assert env["torch"] == top  # the supervisor's own interpreter stays as it was read
    assert env["command"]["packages"] == before["command"]["packages"]


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

"""env.json from real runs: what a run records, `env diff` between two interpreters, the export, check's
warning.

Run A trains in this venv; run B trains the same config under the LLaMA-Factory tool venv
(tests/tools.py), whose transformers, peft and datasets are older: a real package change
between two real runs, each recording its own interpreter. The expected versions are read
from each venv's dist-info folders, not from the collector under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from steadytune.redact import MASK
from steadytune.rundir import RunDir
from tests.tools import tool_venv

from .runs import write_config

pytestmark = pytest.mark.slow

WT = Path(__file__).resolve().parents[2]
SECRET = "hf_" + "Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=repo, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip


def dist_versions(python: str) -> dict[str, str]:
    """``name -> version`` from the dist-info folder names of ``python``'s site-packages."""
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    out = {}
    for d in Path(site).glob("*.dist-info"):
        name, _, version = d.name.removesuffix(".dist-info").partition("-")
        out[name.lower().replace("_", "-")] = version
    return out


def steadytune(python: str, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WT / "src"), str(WT)])}
    return subprocess.run(
        [python, "-m", "steadytune.cli.main", *args], capture_output=True, text=True, cwd=cwd, env=env,
        timeout=timeout,
    )  # fmt: skip


@pytest.mark.tools("llamafactory")
def test_two_real_runs_record_their_environment_and_env_diff_check_and_export_use_it(
    tmp_path: Path, demo_assets: Path
) -> None:
    other = str(tool_venv("llamafactory") / "python")  # built once and reused (tests/tools.py)
    project = tmp_path / "project"
    project.mkdir()
    config = write_config(
        project,
        demo_assets,
        train={"max_steps": 4, "save_steps": 2, "logging_steps": 1},
        run={"name": "envtest"},
    )
    (project / "train.py").write_text("lr = 1e-4\n")
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "config.yaml", "train.py")
    git(project, "commit", "-qm", "first")
    (project / "train.py").write_text(f'lr = 3e-4\nHF_TOKEN = "{SECRET}"\n')  # uncommitted, with a secret

    done = steadytune(
        sys.executable, "run", str(config), "--run-id", "a", "--quiet", "--skip-check", cwd=project
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    a = RunDir(project / "runs" / "a")
    env = json.loads(a.env.read_text())
    import torch

    mine = dist_versions(sys.executable)
    assert (
        f"torch=={mine['torch']}" in env["packages"]
        and f"transformers=={mine['transformers']}" in env["packages"]
    )
    assert env["python"]["executable"] == sys.executable and env["written_by"] == "supervisor"
    assert env["torch"]["read_by"] == "worker" and env["torch"]["torch"] == torch.__version__
    assert env["torch"]["cuda_build"] == torch.version.cuda and "nccl" in env["torch"]
    assert (
        env["git"]["commit"] == git(project, "rev-parse", "HEAD").strip() and env["git"]["branch"] == "main"
    )
    assert env["git"]["dirty"] and "+lr = 3e-4" in env["git"]["diff"]
    assert SECRET not in a.env.read_text() and f"HF_TOKEN = {MASK}" in env["git"]["diff"]

    shown = steadytune(sys.executable, "env", str(a.root), cwd=project)
    assert shown.returncode == 0 and f"torch               {torch.__version__}" in shown.stdout
    assert env["git"]["commit"][:12] in shown.stdout and "dirty" in shown.stdout

    # The export pins this venv exactly: pip, offline, finds every pin already installed.
    req = project / "requirements.txt"
    assert (
        steadytune(sys.executable, "env", "export", str(a.root), "-o", str(req), cwd=project).returncode == 0
    )
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps", "-r", str(req)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    assert pip.stdout.count("Requirement already satisfied") == len(
        [line for line in req.read_text().splitlines() if line and not line.startswith(("#", "-"))]
    )

    same = json.loads(
        steadytune(sys.executable, "check", str(config), "--format", "json", cwd=project).stdout
    )
    assert [c["status"] for c in same["checks"] if c["name"] == "environment"] == ["ok"]

    done = steadytune(other, "run", str(config), "--run-id", "b", "--quiet", "--skip-check", cwd=project)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    b = RunDir(project / "runs" / "b")
    theirs = dist_versions(other)
    assert theirs["transformers"] != mine["transformers"]  # what makes this a real change

    diff = steadytune(
        sys.executable, "env", "diff", str(a.root), str(b.root), "--format", "json", cwd=project
    )
    d = json.loads(diff.stdout)
    changed = d["packages"]["changed"]
    assert changed["transformers"] == {"a": mine["transformers"], "b": theirs["transformers"]}
    assert changed["peft"] == {"a": mine["peft"], "b": theirs["peft"]}
    # (steadytune itself may show on both sides: run from a source tree, its egg-info is on the path)
    assert "llamafactory" in d["packages"]["added"]
    assert "git" not in d or d["git"] == {}  # same commit, same uncommitted change
    text = steadytune(sys.executable, "env", "diff", str(a.root), str(b.root), cwd=project).stdout
    assert f"~ transformers {mine['transformers']} → {theirs['transformers']}" in text

    # check, in this venv again, compares with the newest completed run of the config: b, under the other
    # venv.
    warned = json.loads(
        steadytune(sys.executable, "check", str(config), "--format", "json", cwd=project).stdout
    )
    (c,) = [c for c in warned["checks"] if c["name"] == "environment"]
    assert c["status"] == "warn" and c["data"]["run"] == "b"
    assert f"transformers {theirs['transformers']} → {mine['transformers']}" in c["reason"]
    assert "steadytune env export" in c["fix"]

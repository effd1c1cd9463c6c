"""`steadytune supervise` around the real TRL and LLaMA-Factory CLIs, installed into venvs of their own.

Each test trains the demo model through the tool's own command line under
`supervise`, with a real fault: SIGKILL of the trainer, SIGKILL of the launcher.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from steadytune.records import StepRecord
from steadytune.telemetry.events import read_events
from steadytune.telemetry.stream import iter_records
from tests.tools import tool_venv

from .runs import STEADYTUNE, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trl_bin() -> Path:
    return tool_venv("trl")


def _sft_data(demo_assets: Path, folder: Path) -> Path:
    """The demo set as TRL's prompt/completion conversations."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(demo_assets / "train.jsonl") as fin, open(folder / "train.jsonl", "w") as fout:
        for line in list(fin)[:400]:
            r = json.loads(line)
            fout.write(
                json.dumps(
                    {
                        "prompt": [{"role": "user", "content": f"{r['instruction']} {r['input']}"}],
                        "completion": [{"role": "assistant", "content": r["output"]}],
                    }
                )
                + "\n"
            )
    return folder


def _trl_cmd(trl_bin: Path, demo_assets: Path, data: Path, out: Path, steps: int) -> list[str]:
    return [str(trl_bin / "trl"), "sft", "--model_name_or_path", str(demo_assets / "model"),
            "--dataset_name", str(data), "--dataset_train_split", "train", "--output_dir", str(out),
            "--max_steps", str(steps), "--save_steps", "50", "--logging_steps", "5",
            "--per_device_train_batch_size", "4", "--learning_rate", "1e-4", "--report_to", "none",
            "--use_cpu", "true", "--save_total_limit", "3"]  # fmt: skip


def _trainer(launcher_pid: int) -> psutil.Process | None:
    """The trainer process under `trl sft`'s launcher (it runs trl/scripts/sft.py)."""
    try:
        kids = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.Error:
        return None
    return next((p for p in kids if any("sft.py" in part for part in p.cmdline())), None)


def _steps(run: Path) -> list[StepRecord]:
    return [
        r
        for r in iter_records(run / "telemetry" / "rank-0.jsonl")
        if isinstance(r, StepRecord) and r.loss is not None
    ]


@pytest.mark.parametrize("victim", ["trainer", "launcher"])
def test_trl_sft_survives_a_killed_trainer_or_launcher(
    tmp_path: Path, demo_assets: Path, trl_bin: Path, victim: str
) -> None:
    out, steps = tmp_path / "out", 300
    data = _sft_data(demo_assets, tmp_path / "data")
    cmd = [STEADYTUNE, "supervise", "--preset", "trl", "--output-dir", str(out), "--runs-dir", str(tmp_path / "runs"),
           "--run-id", "trl", "--", *_trl_cmd(trl_bin, demo_assets, data, out, steps)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    run = tmp_path / "runs" / "trl"
    try:
        wait_for(
            lambda: (out / "checkpoint-50" / "trainer_state.json").exists(), timeout=300, what="checkpoint-50"
        )
        launcher = json.loads((run / "status.json").read_text())["worker_pid"]
        trainer = _trainer(launcher)
        assert trainer is not None, "no trainer process under the launcher"
        os.kill(trainer.pid if victim == "trainer" else launcher, signal.SIGKILL)
        stdout, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stdout
    events = read_events(run / "events.jsonl")
    restarts = [e for e in events if e.name == "restart"]
    assert len(restarts) == 1 and "resuming from checkpoint-" in restarts[0].message
    assert not psutil.pid_exists(trainer.pid)
    if victim == "launcher":
        # The orphaned trainer was killed before the next attempt began: never two trainers at once.
        killed = next(e for e in events if e.name == "tree_killed")
        assert trainer.pid in killed.data["pids"]
        assert events.index(killed) < events.index(restarts[0])
    assert events[-1].name == "run_completed"
    # The log dicts behind TRL's progress bar were read, with their step numbers: every logged step
    # of the first attempt, then the resumed attempt from the checkpoint on, and no summary line.
    recs = _steps(run)
    first = [r.step for r in recs if r.attempt == 0]
    second = [r.step for r in recs if r.attempt == 1]
    resumed_from = int(restarts[0].message.split("checkpoint-")[1].split()[0])
    assert first[:3] == [5, 10, 15] and first == sorted(first)
    assert second[0] == resumed_from + 5 and second[-1] == steps
    assert all(r.grad_norm is not None and r.lr is not None for r in recs)
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "completed" and status["max_steps"] == steps and status["step"] == steps
    assert status["tokens_per_s"] and status["last_checkpoint"] == f"checkpoint-{steps}"


@pytest.fixture(scope="module")
def lf_bin() -> Path:
    return tool_venv("llamafactory")


def _lf_config(demo_assets: Path, tmp: Path, steps: int) -> Path:
    """An SFT YAML as LLaMA-Factory users write them, on the demo model and data."""
    data = tmp / "data"
    data.mkdir()
    with open(demo_assets / "train.jsonl") as f:
        rows = [json.loads(line) for line in list(f)[:400]]
    (data / "demo.json").write_text(json.dumps(rows))
    columns = {"prompt": "instruction", "query": "input", "response": "output"}
    (data / "dataset_info.json").write_text(
        json.dumps({"demo": {"file_name": "demo.json", "columns": columns}})
    )
    cfg = tmp / "sft.yaml"
    cfg.write_text(
        f"model_name_or_path: {demo_assets / 'model'}\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
        f"lora_target: all\ndataset: demo\ndataset_dir: {data}\ntemplate: default\ncutoff_len: 64\n"
        f"output_dir: {tmp / 'out'}\nlogging_steps: 5\nsave_steps: 50\nmax_steps: {steps}\n"
        "per_device_train_batch_size: 4\nlearning_rate: 1.0e-4\nreport_to: none\nuse_cpu: true\n"
    )
    return cfg


def test_llamafactory_survives_a_killed_trainer_and_a_truncated_checkpoint(
    tmp_path: Path, demo_assets: Path, lf_bin: Path
) -> None:
    steps = 400
    cfg = _lf_config(demo_assets, tmp_path, steps)
    out = tmp_path / "out"
    cmd = [STEADYTUNE, "supervise", "--preset", "llamafactory", "--output-dir", str(out),
           "--runs-dir", str(tmp_path / "runs"), "--run-id", "lf", "--", str(lf_bin / "llamafactory-cli"),
           "train", str(cfg)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    run = tmp_path / "runs" / "lf"
    try:
        wait_for(
            lambda: (out / "checkpoint-100" / "trainer_state.json").exists(),
            timeout=300,
            what="checkpoint-100",
        )
        worker = json.loads((run / "status.json").read_text())["worker_pid"]
        group = os.getpgid(worker)
        os.killpg(group, signal.SIGSTOP)  # freeze it, so the newest checkpoint is the one we cut
        newest = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        weights = newest / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-100])  # header intact, the file cut short
        os.killpg(group, signal.SIGKILL)
        stdout, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stdout
    events = read_events(run / "events.jsonl")
    corrupt = [e for e in events if e.name == "checkpoint_corrupt"]
    assert corrupt and newest.name in corrupt[0].message and "cut short" in corrupt[0].message
    restart = next(e for e in events if e.name == "restart")
    older = int(newest.name.split("-")[1]) - 50
    assert f"resuming from checkpoint-{older}" in restart.message
    resumed = [e for e in events if e.name == "worker_started"][1]
    assert resumed.data["cmd"][-1] == f"resume_from_checkpoint={out / f'checkpoint-{older}'}"
    assert events[-1].name == "run_completed"
    recs = _steps(run)
    second = [r for r in recs if r.attempt == 1]
    assert second[0].step == older + 5 and second[-1].step == steps
    # trainer_log.jsonl gives the steps; the dict printed for the same step adds the grad norm.
    assert all(r.grad_norm is not None for r in recs)
    status = json.loads((run / "status.json").read_text())
    assert status["max_steps"] == steps and status["state"] == "completed"

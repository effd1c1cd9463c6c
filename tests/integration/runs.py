"""Helpers for tests that drive real supervised runs as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from steadytune.records import StepRecord
from steadytune.rundir import RunDir
from steadytune.telemetry.stream import iter_records
from tests.waiting import wait_for

__all__ = [
    "STEADYTUNE",
    "finish",
    "kill_worker",
    "run_dir",
    "running",
    "start_run",
    "status",
    "steps",
    "wait_for",
    "write_config",
]

STEADYTUNE = str(Path(sys.executable).parent / "steadytune")


def write_config(tmp: Path, assets: Path, **sections: dict[str, Any]) -> Path:
    """A small, fast config on the demo assets; ``sections`` are merged into it."""
    cfg: dict[str, Any] = {
        "model": {"name_or_path": str(assets / "model")},
        "method": "full",
        "data": {"train_file": str(assets / "train.jsonl"), "max_seq_length": 96},
        "train": {
            "learning_rate": 3e-3,
            "per_device_train_batch_size": 4,
            "max_steps": 30,
            "save_steps": 10,
            "warmup_steps": 2,
            "logging_steps": 10,
        },
        "run": {
            "runs_dir": str(tmp / "runs"),
            "restart_backoff_s": 0.2,
            "keep_last": 5,
            "good_window_steps": 3,
        },
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start_run(
    config: Path,
    run_id: str,
    faults: dict | None = None,
    extra_args: list[str] | None = None,
    check: bool = False,
) -> subprocess.Popen:
    """`steadytune run` as a real process. The preflight is skipped unless asked for: these tests
    are about the supervisor, and test_check.py covers the preflight."""
    env = {**os.environ}
    if not check:
        extra_args = ["--skip-check", *(extra_args or [])]
    if faults:
        env["STEADYTUNE_FAULTS"] = json.dumps(faults)
    return subprocess.Popen(
        [STEADYTUNE, "run", str(config), "--run-id", run_id, "--quiet", *(extra_args or [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=config.parent,
    )


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def running(proc: subprocess.Popen) -> bool:
    """True while ``proc`` runs; once it has ended, fails with its output (a wait for it is over)."""
    if proc.poll() is None:
        return True
    out = proc.stdout.read() if proc.stdout else ""
    raise AssertionError(f"the run exited ({proc.returncode}) while the test waited on it:\n{out[-3000:]}")


def run_dir(config: Path, run_id: str) -> RunDir:
    return RunDir(config.parent / "runs" / run_id)


def status(run: RunDir) -> dict[str, Any]:
    try:
        return json.loads(run.status.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def steps(run: RunDir, rank: int = 0) -> list[StepRecord]:
    return [
        r for r in iter_records(run.telemetry(rank)) if isinstance(r, StepRecord) and not r.extra.get("eval")
    ]


def kill_worker(run: RunDir, sig: int = signal.SIGKILL) -> int:
    pid = status(run)["worker_pid"]
    os.kill(pid, sig)
    return pid


def assert_hung_stacks(text: str, frame: str = "transformers/trainer.py") -> None:
    """A hung job's dump holds its trainer's frames, or faulthandler's own crash on the way to them.

    The dump is best effort: the job is continued and aborted, and faulthandler walks every thread
    from a signal handler, newest thread first, while they run. Walking a thread that is moving
    (tqdm's monitor wakes on its own) can fault inside the dump before it reaches the main thread,
    which it prints last; the dump then ends at that fault, which it names.
    """
    assert "Fatal Python error" in text, text[:2000]
    cut_short = text.count("Fatal Python error") > 1 and "Fatal Python error: Segmentation fault" in text
    assert frame in text or cut_short, text[:2000]

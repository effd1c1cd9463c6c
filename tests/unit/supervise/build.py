"""A Supervisor over a config on paths that need not exist, and records handed to it one by one:
what the supervisor's unit tests build on."""

from __future__ import annotations

from pathlib import Path

from steadytune.config.load import validate_dict
from steadytune.records import StepRecord
from steadytune.rundir import RunDir
from steadytune.supervise.supervisor import Supervisor


def supervisor(tmp_path: Path, **sections: dict) -> Supervisor:
    data: dict = {
        "model": {"name_or_path": str(tmp_path / "model")},
        "method": "full",
        "data": {"train_file": str(tmp_path / "train.jsonl")},
        "train": {"learning_rate": 1e-4, "max_steps": 100, "save_steps": 10},
        "run": {"runs_dir": str(tmp_path / "runs"), "good_window_steps": 3},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    cfg = validate_dict(data, base=tmp_path, check_paths=False)
    return Supervisor(cfg, RunDir(tmp_path / "runs" / "r"), observers=[], poll_s=0.05)


def step(sup: Supervisor, n: int) -> None:
    sup.handle(StepRecord(step=n, ts=float(n), loss=1.0, grad_norm=1.0))


def checkpoint(sup: Supervisor, n: int) -> None:
    (sup.run.checkpoints / f"checkpoint-{n}").mkdir(parents=True)
    sup.state.history.checkpoint_steps.append(n)


class FakeWorker:
    """A worker that takes signals and is never gone (a restart waits for its exit): the signals it got."""

    how = "a fake worker"

    def __init__(self, pid: int = 4242) -> None:
        self.pid = pid
        self.signals: list[int] = []

    def signal_tree(self, sig: int) -> None:
        self.signals.append(sig)

    def poll(self) -> None:
        return None

    def python_pids(self) -> list[int]:
        return []

"""A supervised script that prints plain text lines (``step N | loss X | lr Z``): followed as
``analyze`` reads them, and a job none of whose output is read is said, live and at the end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from steadytune.records import Event, StepRecord, run_end
from steadytune.rundir import RunDir
from steadytune.supervise.log_adapter import NO_STEPS_WARN_S, LogAdapter
from steadytune.telemetry.events import read_events
from steadytune.telemetry.stream import JsonlWriter, iter_records
from tests.conftest import STEADYTUNE


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _adapter(tmp_path: Path) -> tuple[RunDir, LogAdapter, _Clock]:
    run = RunDir(tmp_path / "run").create()
    clock = _Clock()
    return run, LogAdapter(JsonlWriter(run.telemetry(0)), ["python", "train.py"], None, clock), clock


def _steps(run: RunDir) -> list[StepRecord]:
    return [r for r in iter_records(run.telemetry(0)) if isinstance(r, StepRecord)]


def _events(run: RunDir, name: str) -> list[Event]:
    return [r for r in iter_records(run.telemetry(0)) if isinstance(r, Event) and r.name == name]


def test_text_lines_naming_a_step_and_a_loss_are_steps(tmp_path: Path) -> None:
    run, adapter, _ = _adapter(tmp_path)
    adapter.on_stdout("loading model...\n")
    for step in (1, 2, 3):
        adapter.on_stdout(f"step {step}/150 | loss {3.0 - step / 10:.2f} | grad_norm 1.5 | lr 2e-05\n")
    assert [(r.step, r.loss, r.grad_norm, r.lr) for r in _steps(run)] == [
        (1, 2.9, 1.5, 2e-05), (2, 2.8, 1.5, 2e-05), (3, 2.7, 1.5, 2e-05),
    ]  # fmt: skip
    [begin] = _events(run, "train_begin")
    assert begin.data["max_steps"] == 150  # the job's own total, from its "step N/M"
    assert adapter.peak_lr == 2e-05


def test_text_lines_are_not_steps_of_a_job_that_prints_log_dicts(tmp_path: Path) -> None:
    run, adapter, _ = _adapter(tmp_path)
    adapter.on_stdout("{'loss': 2.5, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.1}\n")
    adapter.on_stdout("step 7 | loss 9.9\n")  # the job's own echo of a step the dicts count
    assert [(r.step, r.loss) for r in _steps(run)] == [(1, 2.5)]


def test_output_with_no_step_read_is_warned_once_after_a_while(tmp_path: Path) -> None:
    run, adapter, clock = _adapter(tmp_path)
    adapter.on_stdout("it 1 L=2.3\n")
    clock.now = NO_STEPS_WARN_S - 1
    adapter.on_stdout("it 2 L=2.2\n")
    assert _events(run, "no_steps_read") == []
    clock.now = NO_STEPS_WARN_S + 1
    adapter.on_stdout("it 3 L=2.1\n")
    adapter.on_stdout("it 4 L=2.0\n")
    [warned] = _events(run, "no_steps_read")
    assert warned.severity == "warning" and "trainer_log.jsonl" in warned.message


def test_a_job_whose_steps_are_read_is_not_warned(tmp_path: Path) -> None:
    run, adapter, clock = _adapter(tmp_path)
    adapter.on_stdout("step 1 | loss 2.0\n")
    clock.now = NO_STEPS_WARN_S * 3
    adapter.on_stdout("still training\n")
    assert _events(run, "no_steps_read") == []


def _supervise(tmp_path: Path, python: str, job: str) -> list[Event]:
    cfg = tmp_path / "my.yaml"
    cfg.write_text("train:\n  max_steps: 200\n  learning_rate: 0.002\n")
    proc = subprocess.run(
        [STEADYTUNE, "supervise", "--config", str(cfg), "--runs-dir", str(tmp_path / "runs"),
         "--run-id", "r1", "--", python, "-c", job],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return read_events(tmp_path / "runs" / "r1" / "events.jsonl")


def test_a_completed_job_none_of_whose_steps_was_read_says_so(tmp_path: Path, stdlib_python: str) -> None:
    events = _supervise(tmp_path, stdlib_python, "for i in range(3): print(f'it {i} L={2.0 - i / 10}')")
    end = run_end(events)
    assert end is not None and end.name == "run_completed" and end.severity == "warning"
    assert "no training step was ever read" in end.message


def test_a_plain_text_job_is_followed_to_its_end(tmp_path: Path, stdlib_python: str) -> None:
    job = "for i in range(1, 151): print(f'step {i}/150 | loss {2.0 - i / 1000} | grad_norm 1.0 | lr 2e-05')"
    events = _supervise(tmp_path, stdlib_python, job)
    end = run_end(events)
    assert end is not None and end.name == "run_completed" and end.severity == "info", end
    assert end.step == 150
    status = json.loads((tmp_path / "runs" / "r1" / "status.json").read_text())
    assert status["max_steps"] == 150  # the job's own total, from its "step N/M"


def test_a_job_that_logs_no_total_is_shown_none_not_the_configs(tmp_path: Path, stdlib_python: str) -> None:
    _supervise(tmp_path, stdlib_python, "for i in range(1, 31): print(f'step {i} | loss {2.0 - i / 100}')")
    status = json.loads((tmp_path / "runs" / "r1" / "status.json").read_text())
    assert status["step"] == 30 and status["max_steps"] is None  # not my.yaml's 200: that is no job's


def test_a_job_line_without_an_end_is_kept_in_the_log_and_read_past_in_bounded_memory(
    tmp_path: Path, stdlib_python: str
) -> None:
    """A job that prints 256 MiB with no newline between two stretches of steps: its log keeps every
    byte, its steps on both sides are read, and the supervisor never holds the line (held whole and
    decoded, it took the supervisor to 1.2 GB)."""
    cfg = tmp_path / "my.yaml"
    cfg.write_text("train:\n  max_steps: 200\n")
    job = (
        "import sys\n"
        "for i in range(1, 11): print(f'step {i} | loss {2.0 - i / 100}', flush=True)\n"
        "for _ in range(256): sys.stdout.write('x' * (1 << 20))\n"
        "sys.stdout.write('\\n')\n"
        "for i in range(11, 21): print(f'step {i} | loss {2.0 - i / 100}', flush=True)\n"
    )
    # A fresh parent, so the peak it reports is the supervising tree's alone.
    peak = subprocess.run(
        [sys.executable, "-c",
         "import resource, subprocess, sys; "
         "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
         STEADYTUNE, "supervise", "--config", str(cfg), "--runs-dir", str(tmp_path / "runs"),
         "--run-id", "r1", "--", stdlib_python, "-c", job],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=True,
    )  # fmt: skip
    run = RunDir(tmp_path / "runs" / "r1")
    assert [r.step for r in _steps(run)] == list(range(1, 21))
    logs = [p for p in run.root.rglob("*.log") if p.stat().st_size > 256 << 20]
    assert len(logs) == 1 and logs[0].stat().st_size > (256 << 20) + 20 * 10
    logs[0].unlink()  # a quarter of a gigabyte the tests need not keep
    # KiB: ~220 MB (the supervisor and its imports), where the line held whole and decoded took 1.2 GB
    assert int(peak.stdout.split()[-1]) < 512 << 10, peak.stdout

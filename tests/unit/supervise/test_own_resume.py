"""A watched job's first step past where its attempt was started is said as the tool's own resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from steadytune.records import Event, StepRecord
from steadytune.supervise.restarts import own_resume_note
from steadytune.telemetry.events import read_events
from steadytune.telemetry.stream import iter_records

STEADYTUNE = str(Path(sys.executable).parent / "steadytune")


def test_a_rerun_command_that_resumed_from_its_own_checkpoint_says_so() -> None:
    note = own_resume_note(first_step=55, began=0, checkpoint_steps=[20, 54, 60])
    assert note is not None
    assert "resumed from step 54 by itself" in note and "checkpoint-54" in note
    assert "first step is 55, not 1" in note


def test_a_restart_that_went_past_the_plans_checkpoint_names_the_job_s_own() -> None:
    note = own_resume_note(first_step=81, began=40, checkpoint_steps=[40, 80])
    assert note is not None and "resumed from step 80 by itself" in note and "not 41" in note


def test_a_job_that_started_where_it_was_started_says_nothing() -> None:
    assert own_resume_note(first_step=10, began=0, checkpoint_steps=[]) is None  # a fresh start
    assert own_resume_note(first_step=41, began=40, checkpoint_steps=[20, 40]) is None  # the plan's resume
    assert own_resume_note(first_step=5, began=0, checkpoint_steps=[5, 10]) is None  # saved at its first step


def _rows(path: Path, steps: range, mode: str = "a") -> None:
    with open(path, mode, encoding="utf-8") as f:
        for s in steps:
            f.write(json.dumps({"current_steps": s, "total_steps": 100, "loss": 2.0 - s / 100}) + "\n")


def _adapter(tmp_path: Path):
    from steadytune.rundir import RunDir
    from steadytune.supervise.log_adapter import LogAdapter
    from steadytune.telemetry.stream import JsonlWriter

    run = RunDir(tmp_path / "run").create()
    writer = JsonlWriter(run.telemetry(0))
    return run, writer, LogAdapter(writer, ["llamafactory-cli", "train"], tmp_path / "out", clock=lambda: 0.0)


def _steps(run) -> list[int]:
    return [r.step for r in iter_records(run.telemetry(0)) if isinstance(r, StepRecord)]


def test_a_command_run_again_reads_only_the_rows_it_writes_to_an_earlier_trainer_log(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    log = tmp_path / "out" / "trainer_log.jsonl"
    _rows(log, range(5, 55, 5))  # the earlier run's, up to its checkpoint-50 and a bit past
    run, writer, adapter = _adapter(tmp_path)
    adapter.begin(0, None)
    _rows(log, range(55, 65, 5))  # resumed by itself from checkpoint-50: it appends
    adapter.poll_files()
    writer.close()
    assert _steps(run) == [55, 60]  # its first step is past 0, as own_resume_note is told


def test_a_fresh_start_that_replaces_the_trainer_log_is_read_from_the_top(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    log = tmp_path / "out" / "trainer_log.jsonl"
    _rows(log, range(5, 55, 5))
    run, writer, adapter = _adapter(tmp_path)
    adapter.begin(0, None)
    log.unlink()  # overwrite_output_dir: the earlier log goes, a new one is written
    _rows(log, range(5, 15, 5), mode="w")
    adapter.poll_files()
    writer.close()
    assert _steps(run) == [5, 10]


# Goes on from the newest checkpoint-N in out/ by itself, as LLaMA-Factory does, appending to its log.
_SELF_RESUMING_JOB = """
import json, pathlib
out = pathlib.Path('out'); out.mkdir(exist_ok=True)
done = max([int(p.name.split('-')[1]) for p in out.glob('checkpoint-*')] or [0])
with open(out / 'trainer_log.jsonl', 'a') as log:
    for s in range(done + 1, done + 11):
        log.write(json.dumps({'current_steps': s, 'total_steps': 20, 'loss': 2.0 - s / 100}) + '\\n')
(out / f'checkpoint-{done + 10}').mkdir()
"""


def _supervise(tmp_path: Path, python: str, run_id: str) -> list[Event]:
    proc = subprocess.run(
        [STEADYTUNE, "supervise", "--runs-dir", str(tmp_path / "runs"), "--run-id", run_id,
         "--output-dir", "out", "--", python, "-c", _SELF_RESUMING_JOB],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return read_events(tmp_path / "runs" / run_id / "events.jsonl")


def test_the_same_command_run_again_says_it_resumed_by_itself(tmp_path: Path, stdlib_python: str) -> None:
    first = _supervise(tmp_path, stdlib_python, "r1")
    assert not [e for e in first if e.name == "job_resumed_itself"]
    [said] = [e for e in _supervise(tmp_path, stdlib_python, "r2") if e.name == "job_resumed_itself"]
    assert said.step == 11 and "resumed from step 10 by itself" in said.message

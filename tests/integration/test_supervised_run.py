"""A supervised run, end to end, with real training, real processes and real signals."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from steadytune.checkpoint.manifest import verify
from steadytune.checkpoint.store import read_pointer
from steadytune.records import Event, PlanRevision, from_json, run_end
from steadytune.telemetry.events import read_events

from .runs import finish, kill_worker, run_dir, start_run, status, steps, wait_for, write_config

pytestmark = pytest.mark.slow


def plans(run) -> list[PlanRevision]:
    return [from_json(line) for line in run.plan.read_text().splitlines() if line.strip()]


def step_numbers_latest_attempt_wins(run) -> list[int]:
    """Read the telemetry back as a reader must: the latest attempt's record of each step wins."""
    by_step = {}
    for rec in steps(run):
        if rec.step not in by_step or rec.attempt >= by_step[rec.step].attempt:
            by_step[rec.step] = rec
    return sorted(by_step)


def test_clean_run_writes_the_run_directory(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(tmp_path, demo_assets, train={"max_steps": 20, "save_steps": 10})
    rc, out = finish(start_run(cfg, "clean"))
    assert rc == 0, out
    run = run_dir(cfg, "clean")
    for path in (run.config, run.plan, run.events, run.system, run.telemetry(0), run.status):
        assert path.exists(), path
    records = steps(run)
    assert [r.step for r in records] == list(range(1, 21))  # one record per optimizer step
    first = records[0]
    assert first.loss is not None and first.grad_norm is not None and first.lr is not None
    assert first.tokens and first.samples == 4 and first.step_time_s and first.rss_bytes
    assert first.batch is not None and len(first.batch.indices) == 4 and len(first.batch.hashes) == 4
    for name in ("checkpoint-10", "checkpoint-20"):
        assert verify(run.checkpoints / name).ok
    assert read_pointer(run.latest_pointer).name == "checkpoint-20"
    assert read_pointer(run.last_good_pointer) is not None
    assert (run.root / "final").is_dir()
    events = read_events(run.events)
    assert events[0].name == "run_started" and run_end(events).name == "run_completed"
    assert status(run)["state"] == "completed"
    assert "loss first → last" in out and str(run.root) in out


def test_sigkill_mid_run_resumes_from_last_verified_checkpoint(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(tmp_path, demo_assets, train={"max_steps": 40, "save_steps": 10})
    proc = start_run(cfg, "killed", faults={"step_sleep_s": 0.15})
    run = run_dir(cfg, "killed")
    wait_for(lambda: verify(run.checkpoints / "checkpoint-10").ok and len(steps(run)) >= 14, what="step 14")
    killed_at = steps(run)[-1].step
    kill_worker(run, signal.SIGKILL)
    rc, out = finish(proc)
    assert rc == 0, out
    revisions = plans(run)
    assert len(revisions) == 2
    resume = revisions[1].resume_checkpoint
    assert resume and Path(resume).name in {f"checkpoint-{s}" for s in range(10, killed_at + 1, 10)}
    assert revisions[1].reason == "killed" and revisions[1].cause_event_seq is not None
    assert step_numbers_latest_attempt_wins(run) == list(range(1, 41))  # max_steps reached, no gap
    attempts = {r.attempt for r in steps(run)}
    assert attempts == {0, 1}
    restart = [e for e in read_events(run.events) if e.kind == "action" and e.name == "restart"]
    assert len(restart) == 1 and restart[0].data["classification"] == "killed"


def test_sigkill_during_save_never_resumes_the_partial_checkpoint(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(tmp_path, demo_assets, train={"max_steps": 30, "save_steps": 10})
    proc = start_run(cfg, "torn", faults={"slow_save_s": 30, "step_sleep_s": 0.05})
    run = run_dir(cfg, "torn")
    # The slow hook holds the first save in its unsafe window: checkpoint-10 is the torn one.
    torn = run.checkpoints / "checkpoint-10"
    wait_for(
        lambda: torn.is_dir() and not (torn / "MANIFEST.json").exists(), what="a save in its unsafe window"
    )
    kill_worker(run, signal.SIGKILL)
    rc, out = finish(proc)
    assert rc == 0, out
    second = plans(run)[1]
    assert (
        second.resume_checkpoint is None
    )  # no verified checkpoint existed: start over, not from the torn one
    skipped = [e for e in read_events(run.events) if e.name == "checkpoint_corrupt"]
    assert skipped and "MANIFEST" in skipped[0].message
    assert step_numbers_latest_attempt_wins(run) == list(range(1, 31))


def test_sigkill_during_second_save_resumes_from_the_first(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(tmp_path, demo_assets, train={"max_steps": 30, "save_steps": 10})
    proc = start_run(cfg, "torn2", faults={"slow_save_s": 4, "step_sleep_s": 0.05})
    run = run_dir(cfg, "torn2")
    torn = run.checkpoints / "checkpoint-20"
    wait_for(
        lambda: torn.is_dir() and not (torn / "MANIFEST.json").exists(),
        timeout=180,
        what="the second save in its unsafe window",
    )
    assert verify(run.checkpoints / "checkpoint-10").ok
    kill_worker(run, signal.SIGKILL)
    rc, out = finish(proc)
    assert rc == 0, out
    assert Path(plans(run)[1].resume_checkpoint).name == "checkpoint-10"
    assert step_numbers_latest_attempt_wins(run) == list(range(1, 31))


def test_deterministic_error_is_not_retried(tmp_path: Path, demo_assets: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "no known columns"}) + "\n")
    cfg = write_config(tmp_path, demo_assets, data={"train_file": str(bad)})
    rc, out = finish(start_run(cfg, "bad-data"))
    assert rc == 1
    run = run_dir(cfg, "bad-data")
    assert len(plans(run)) == 1  # no restart was attempted
    final = run_end(read_events(run.events))
    assert final.name == "run_failed" and final.data["classification"] == "deterministic"
    assert "cannot tell the data format" in final.message
    assert "Traceback" not in out


def test_crash_mid_run_is_restarted_and_a_repeat_is_deterministic(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(tmp_path, demo_assets, train={"max_steps": 20, "save_steps": 5})
    rc, out = finish(start_run(cfg, "transient", faults={"crash_at_step": 12, "fault_attempts": 1}))
    assert rc == 0, out
    run = run_dir(cfg, "transient")
    assert [p.reason for p in plans(run)] == ["start", "python_error"]
    assert Path(plans(run)[1].resume_checkpoint).name == "checkpoint-10"

    rc, out = finish(start_run(cfg, "repeating", faults={"crash_at_step": 12, "fault_attempts": 99}))
    assert rc == 1
    run = run_dir(cfg, "repeating")
    assert len(plans(run)) == 2  # one restart, then the same error at the same step: stop
    final = run_end(read_events(run.events))
    assert final.data["classification"] == "deterministic" and "twice" in final.message


def test_sigterm_checkpoints_and_stops(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(tmp_path, demo_assets, train={"max_steps": 200, "save_steps": 100})
    proc = start_run(cfg, "interrupted", faults={"step_sleep_s": 0.1})
    run = run_dir(cfg, "interrupted")
    wait_for(lambda: len(steps(run)) >= 5, what="step 5")
    proc.send_signal(signal.SIGTERM)
    rc, out = finish(proc)
    assert rc == 0, out
    assert status(run)["state"] == "stopped"
    latest = read_pointer(run.latest_pointer)
    assert latest is not None and verify(latest).ok  # the stop wrote a verified checkpoint
    last_step = steps(run)[-1].step
    assert latest.name == f"checkpoint-{last_step}" and last_step < 200
    assert any(isinstance(e, Event) and e.name == "ack_stop" for e in read_events(run.events))

"""`steadytune drill --supervise -- CMD` on the plain HF Trainer script: every fault from outside,
recovered."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from steadytune.drill.runner import finite_weights
from steadytune.records import StepRecord, run_end
from steadytune.telemetry.events import read_events
from steadytune.telemetry.stream import iter_records

from .hfjob import hf_job
from .runs import STEADYTUNE, assert_hung_stacks

# Six supervised runs, one of them timed for a hang: kept off the other heavy tests (marker serial).
pytestmark = [pytest.mark.slow, pytest.mark.serial]
FAULTS = ("kill", "truncated", "hang", "lr", "sigterm")


def _script(demo_assets: Path, steps: int, sleep: float, *extra: str) -> list[str]:
    return hf_job(demo_assets, "{output_dir}", steps, sleep, *extra)


def _run_of(runs: Path, kind: str) -> Path:
    (found,) = [p for p in runs.iterdir() if p.is_dir() and p.name.startswith(f"{kind}-")]
    return found


def test_every_outside_fault_is_detected_and_recovered_under_the_native_table(
    tmp_path: Path, demo_assets: Path
) -> None:
    runs = tmp_path / "runs"
    cmd = [STEADYTUNE, "drill", "--supervise", "--faults", ",".join(FAULTS), "--runs-dir", str(runs), "--",
           *_script(demo_assets, 40, 0.05, "--learning_rate", "2e-3")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    # The native drill's table: one row per fault, each detected and recovered.
    assert "fault                 at  detected  step  action             recovered  redone  recover s" in out
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.split()[:1] and line.split()[0] in FAULTS and len(line.split()) == 8
    }
    assert set(rows) == set(FAULTS)
    for row in rows.values():
        assert row[2] == "yes" and row[5] == "yes", row
    assert rows["kill"][4] == "restart" and rows["hang"][4] == "restart" and rows["truncated"][4] == "restart"
    assert rows["lr"][4] == "rollback" and rows["sigterm"][4] == "run_stopped"
    assert "completed: yes   weights finite: yes" in out
    # Each run's goodput beside the clean run's, from the run folders the drill leaves.
    shares = dict(re.findall(r"^  (\S+)\s+([\d.]+) % of \S+ — lost: ", out, re.M))
    assert set(shares) == {"clean", *FAULTS} and all(0 < float(v) < 100 for v in shares.values()), out
    outputs = runs / "outputs"

    def plans(run: Path) -> list[dict]:
        return [json.loads(line) for line in (run / "plan.jsonl").read_text().splitlines()]

    def last_step(out_dir: Path) -> int:
        return json.loads((out_dir / "checkpoint-40" / "trainer_state.json").read_text())["global_step"]

    # kill: the SIGKILL was seen as such, the job resumed from a checkpoint and went on to the end.
    kill = _run_of(runs, "kill")
    restart = next(e for e in read_events(kill / "events.jsonl") if e.name == "restart")
    assert restart.data["classification"] == "killed"
    assert plans(kill)[1]["resume_checkpoint"].endswith("checkpoint-20")
    assert last_step(outputs / kill.name) == 40 and finite_weights(outputs / kill.name / "checkpoint-40")
    recs = iter_records(kill / "telemetry" / "rank-0.jsonl")  # steps, and the job's own events (train_begin)
    resumed = [r.step for r in recs if isinstance(r, StepRecord) and r.attempt == 1]
    assert resumed and 20 < resumed[0] <= 22  # the steps continue from the checkpoint, not from 0

    # truncated: the cut checkpoint was skipped, the one before it used.
    trunc = _run_of(runs, "truncated")
    corrupt = next(e for e in read_events(trunc / "events.jsonl") if e.name == "checkpoint_corrupt")
    assert corrupt.message.startswith("checkpoint-20 skipped") and "cut short" in corrupt.message
    assert plans(trunc)[1]["resume_checkpoint"].endswith("checkpoint-10")
    assert last_step(outputs / trunc.name) == 40

    # hang: the stopped trainer was called hung, its stacks dumped, and it was restarted.
    hang = _run_of(runs, "hang")
    events = read_events(hang / "events.jsonl")
    names = [e.name for e in events]
    # The policy's restart action comes first; the job's restart (the one with its cause) after the stacks.
    restarted = max(i for i, e in enumerate(events) if e.name == "restart" and "classification" in e.data)
    assert names.index("stall") < names.index("stacks_dumped") < restarted < names.index("run_completed")
    assert_hung_stacks((hang / "stacks" / "attempt-0.txt").read_text())
    assert events[restarted].data["classification"] == "stall"  # the anomaly that called the hang

    # lr: 1000x the job's LR; the rollback restarted it at the job's own LR; the weights are finite.
    lr = _run_of(runs, "lr")
    events = read_events(lr / "events.jsonl")
    started = [e.data["cmd"] for e in events if e.name == "worker_started"]
    assert started[0][-2:] == ["--learning_rate", "2"] and started[-1][-2:] == ["--learning_rate", "0.002"]
    names = [e.name for e in events]
    first_bad = next(e for e in events if e.kind == "anomaly")
    assert names.index(first_bad.name) < names.index("rollback") and run_end(events).name == "run_completed"
    assert finite_weights(outputs / lr.name / "checkpoint-40")

    # sigterm: stopped cleanly, and says so.
    stop = _run_of(runs, "sigterm")
    assert json.loads((stop / "status.json").read_text())["state"] == "stopped"
    events = read_events(stop / "events.jsonl")
    stopped = run_end(events)
    assert stopped.name == "run_stopped" and events[events.index(stopped) - 1].name == "stop_requested"


# A job that prints five HF log dicts and ends, whatever its arguments.
SHORT_JOB = (
    "import time\nfor i in range(5):\n    print({'loss': 2.0 - i / 10, 'epoch': i / 5}, "
    "flush=True)\n    time.sleep(0.1)\n"
)


def test_a_fault_that_never_came_is_not_recovered_and_the_drill_fails(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(SHORT_JOB)
    cmd = [STEADYTUNE, "drill", "--supervise", "--faults", "kill@50", "--runs-dir", str(tmp_path / "runs"),
           "--json", "--", sys.executable, str(job), "--output_dir", "{output_dir}"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    (fault,) = json.loads(done.stdout)["faults"]
    assert fault["kind"] == "kill" and not fault["detected"] and not fault["recovered"]


def test_a_command_that_fails_by_itself_is_not_drilled(tmp_path: Path) -> None:
    cmd = [
        STEADYTUNE,
        "drill",
        "--supervise",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--base-lr",
        "1e-3",
        "--",
        sys.executable,
        "-c",
        "import sys; sys.exit(3)",
        "--output_dir",
        "{output_dir}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "the clean run of the command ended failed" in done.stderr and "no fault was run" in done.stderr
    assert [p.name.split("-")[0] for p in (tmp_path / "runs").iterdir() if p.is_dir()] == ["clean"]

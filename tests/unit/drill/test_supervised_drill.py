"""`drill --supervise`: shaping the supervised command, placing faults, reading the outcome back."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from steadytune.checkpoint.external import check_external_checkpoint
from steadytune.cli.main import build_parser
from steadytune.cli.main import main as cli
from steadytune.drill import external
from steadytune.drill.command import SuperviseLine, float_value, supervise_argv, with_output_dir
from steadytune.drill.faults import parse_inject
from steadytune.drill.runner import report_run
from steadytune.records import PlanRevision, StepRecord, to_json
from steadytune.rundir import RunDir
from steadytune.supervise.command import flag_value
from steadytune.supervise.process import running
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.stream import JsonlWriter


def test_each_run_gets_its_own_output_folder_however_the_command_names_it() -> None:
    out = Path("/d/kill")
    assert with_output_dir(["t.py", "--output_dir", "{output_dir}"], out) == [
        "t.py",
        "--output_dir",
        "/d/kill",
    ]
    assert with_output_dir(["t.py", "--out={output_dir}/x"], out) == ["t.py", "--out=/d/kill/x"]
    assert with_output_dir(["t.py", "--output_dir", "mine", "--lr", "1"], out)[2] == "/d/kill"
    assert with_output_dir(["t.py", "--output-dir=mine"], out) == ["t.py", "--output-dir=/d/kill"]
    # LLaMA-Factory: key=value after its YAML
    assert (
        with_output_dir(["llamafactory-cli", "train", "a.yaml", "output_dir=saves"], out)[3]
        == "output_dir=/d/kill"
    )
    with pytest.raises(ValueError, match=r"\{output_dir\}"):
        with_output_dir(["t.py", "--model", "m"], out)


def test_values_are_read_as_the_tools_read_them_the_last_one_wins() -> None:
    cmd = ["t.py", "--learning_rate", "2e-3", "--save-steps=10", "learning_rate=5e-5"]
    assert flag_value(cmd, "learning_rate") == "5e-5"
    assert flag_value(cmd, "save_steps") == "10"
    assert float_value(["t.py", "--learning_rate", "fast"], "learning_rate") is None
    assert flag_value(["t.py", "--learning_rate"], "learning_rate") is None  # no value after it


def test_the_supervise_line_is_one_the_real_supervise_parser_takes() -> None:
    line = SuperviseLine(
        "--resume_from_checkpoint {checkpoint}",
        "--learning_rate {lr}",
        8.0,
        Path("/c.yaml"),
        ("policy.rollback_lr_scale=0.001",),
        python="py",
    )
    argv = supervise_argv(line, ["py", "t.py", "--output_dir", "/o"], Path("/o"), Path("/r"), "kill-1", 2.0)
    assert argv[:4] == ["py", "-m", "steadytune.cli.main", "supervise"]
    args = build_parser("supervise").parse_args(argv[3:])
    assert args.config == Path("/c.yaml") and args.set == ["policy.rollback_lr_scale=0.001"]
    assert (
        args.resume_arg == "--resume_from_checkpoint {checkpoint}" and args.lr_arg == "--learning_rate {lr}"
    )
    assert args.base_lr == 2.0 and args.hang_floor == 8.0 and args.output_dir == Path("/o")
    assert args.runs_dir == Path("/r") and args.run_id == "kill-1"
    assert args.cmd[-4:] == ["py", "t.py", "--output_dir", "/o"]


def test_faults_are_placed_from_the_checkpoint_interval_and_can_be_moved() -> None:
    known = external.catalogue(10)
    assert {k: f.at_step for k, f in known.items()} == {"kill": 25, "truncated": 20, "hang": 25, "lr": 1,
                                                         "sigterm": 25}  # fmt: skip
    (kill, lr) = parse_inject("kill@33,lr", 10, known)
    assert (kill.kind, kill.at_step, kill.actor) == ("kill", 33, "kill") and lr.at_step == 1
    with pytest.raises(ValueError, match="choose from kill, truncated, hang, lr, sigterm"):
        parse_inject("nan", 10, known)  # needs a hook inside the job: not a fault from outside
    with pytest.raises(ValueError, match="whole number"):
        parse_inject("kill@late", 10, known)


def test_every_problem_with_the_command_is_said_at_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc = cli(
        [
            "drill",
            "--supervise",
            "--runs-dir",
            str(tmp_path),
            "--",
            "python",
            "t.py",
            "--max_steps",
            "20",
            "--save_steps",
            "10",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert "3 problem(s)" in err
    assert "{output_dir}" in err  # no output folder named
    assert "before fault(s) kill@25, truncated@20, hang@25, sigterm@25" in err  # the job ends first
    assert "--base-lr" in err  # the lr fault needs the job's LR
    assert not any(tmp_path.iterdir())  # nothing was run


def test_a_native_drill_takes_one_config_at_most(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["drill", "a.yaml", "b.yaml"]) == 2
    assert "--supervise" in capsys.readouterr().err


CHILD = (
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; "
    "time.sleep(30)']); time.sleep(30)"
)


def test_the_trainer_is_the_deepest_python_process_of_the_job() -> None:
    import psutil

    launcher = subprocess.Popen([sys.executable, "-c", CHILD])
    alone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(launcher.pid).children() and time.monotonic() < deadline:
            time.sleep(0.02)
        (child,) = psutil.Process(launcher.pid).children()
        assert external.trainer_pid(launcher.pid) == child.pid
        assert external.trainer_pid(alone.pid) == alone.pid
        assert running([child.pid, alone.pid]) == [child.pid, alone.pid]
    finally:
        for p in (child, launcher, alone):
            p.kill()
    alone.wait()
    assert running([alone.pid]) == []


def _safetensors(path: Path, n: int) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * (4 * n))


def test_truncation_cuts_the_newest_checkpoint_only(tmp_path: Path) -> None:
    for step in (10, 20):
        ck = tmp_path / f"checkpoint-{step}"
        ck.mkdir()
        (ck / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        _safetensors(ck / "model.safetensors", 64)
    name, what = external.truncate_newest(tmp_path)
    assert name == "checkpoint-20" and "model.safetensors" in what
    assert not check_external_checkpoint(tmp_path / "checkpoint-20")[0]
    assert check_external_checkpoint(tmp_path / "checkpoint-10") == (True, "")


def _run(
    tmp_path: Path, attempts: list[tuple[str | None, list[int]]], events: list[tuple[str, str, int]]
) -> RunDir:
    """A run directory as a supervisor leaves it: one plan line and a few steps per attempt, then events."""
    run = RunDir(tmp_path / "run").create()
    log, steps, t = EventLog(run.events, "run", audit=False), JsonlWriter(run.telemetry(0)), 1000.0
    for attempt, (resume, done) in enumerate(attempts):
        plan = PlanRevision(revision=attempt, ts=t, reason="start", attempt=attempt, resume_checkpoint=resume)
        with open(run.plan, "a") as f:
            f.write(to_json(plan) + "\n")
        for s in done:
            t += 1.0
            steps.write(StepRecord(step=s, ts=t, attempt=attempt, loss=2.0))
    for kind, name, step in events:
        log.emit(kind, name, name, step=step)
    return run


def test_a_restart_reads_back_as_detected_recovered_with_its_steps_redone(tmp_path: Path) -> None:
    run = _run(tmp_path, [(None, list(range(1, 26))), ("/o/checkpoint-20", list(range(21, 41)))],
               [("action", "restart", 25), ("lifecycle", "run_completed", 40)])  # fmt: skip
    spec = external.catalogue(10)["kill"]
    r = report_run(spec, run, "completed", 1000.0, True)
    assert (r.detected, r.action, r.recovered, r.restarts, r.steps_redone) == (True, "restart", True, 1, 5)
    assert r.recovery_seconds == 26.0  # from the fault to the first step of the resumed attempt
    assert not report_run(spec, run, "completed", 1000.0, False).recovered  # weights unusable
    assert not report_run(spec, run, "failed", 1000.0, True).recovered


def test_a_clean_stop_is_the_answer_to_sigterm_and_its_loss_is_not_compared(tmp_path: Path) -> None:
    import time as clock

    start = clock.time()
    run = _run(tmp_path, [(None, list(range(1, 26)))],
               [("lifecycle", "stop_requested", 25), ("lifecycle", "run_stopped", 25)])  # fmt: skip
    spec = external.catalogue(10)["sigterm"]
    r = report_run(spec, run, "stopped", start, True)
    assert (r.detected, r.action, r.recovered, r.restarts, r.steps_redone) == (
        True,
        "run_stopped",
        True,
        0,
        0,
    )
    assert r.recovery_seconds is not None and 0 <= r.recovery_seconds < 60
    assert r.final_loss is None
    assert not report_run(spec, run, "completed", start, True).recovered  # it was meant to stop


def test_a_fault_that_never_happened_or_a_job_left_running_is_not_recovered(tmp_path: Path) -> None:
    run = _run(tmp_path, [(None, [1, 2])], [("lifecycle", "run_completed", 2)])
    spec = external.catalogue(10)["kill"]
    never = external.Outcome(run, tmp_path / "out", "completed", 0, fault_ts=None)
    assert not external.usable(spec, never)
    left = external.Outcome(
        run, tmp_path / "out", "stopped", 128 + signal.SIGTERM, fault_ts=1.0, left_running=[4242]
    )
    assert not external.usable(external.catalogue(10)["sigterm"], left)
    clean_stop = external.Outcome(run, tmp_path / "out", "stopped", 128 + signal.SIGTERM, fault_ts=1.0)
    assert external.usable(external.catalogue(10)["sigterm"], clean_stop)
    killed_instead = external.Outcome(run, tmp_path / "out", "stopped", -9, fault_ts=1.0)
    assert not external.usable(external.catalogue(10)["sigterm"], killed_instead)


def test_faults_that_need_a_hook_inside_the_job_are_refused_with_the_way_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc = cli(["drill", "--supervise", "--faults", "nan,kill,oom@30", "--runs-dir", str(tmp_path), "--",
              "python", "t.py", "--output_dir", "{output_dir}"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "1 problem(s)" in err
    assert "nan, oom: done through a hook inside" in err and "`steadytune drill` (native)" in err
    assert cli(["drill", "--supervise", "--faults", ",", "--", "t.py", "--output_dir", "{output_dir}"]) == 2
    assert "no fault to drill" in capsys.readouterr().err


def test_a_nan_fault_that_never_landed_says_so_rather_than_detected_no_recovered_yes(tmp_path: Path) -> None:
    from steadytune.cli.drill import render
    from steadytune.drill.runner import as_dict

    spec = external.catalogue(10, inject=True)["nan"]
    never = _run(tmp_path / "a", [(None, list(range(1, 41)))], [("lifecycle", "run_completed", 40)])
    r = report_run(spec, never, "completed", None, True)
    assert (r.injected, r.detected, r.recovered) == (False, False, False)
    row = render(
        {"faults": [as_dict(r)], "clean_final_loss": 2.0, "completed": r.recovered, "weights_finite": True}
    ).splitlines()[2]
    assert "fault not injected" in row and "yes" not in row
    landed = _run(tmp_path / "b", [(None, list(range(1, 41)))],
                  [("lifecycle", "fault_injected", 25), ("action", "skip_step", 25),
                   ("lifecycle", "run_completed", 40)])  # fmt: skip
    r = report_run(spec, landed, "completed", None, True)
    assert (r.injected, r.detected, r.recovered) == (True, True, True)
    assert "fault not injected" not in render(
        {"faults": [as_dict(r)], "clean_final_loss": 2.0, "completed": r.recovered, "weights_finite": True}
    )


def test_a_clean_run_that_restarted_on_its_own_is_no_reference(tmp_path: Path) -> None:
    smooth = _run(tmp_path / "a", [(None, list(range(1, 41)))], [("lifecycle", "run_completed", 40)])
    assert external.clean_run_problem(smooth, 8.0) is None
    stalled = _run(tmp_path / "b", [(None, list(range(1, 11))), ("/o/checkpoint-10", list(range(11, 41)))],
                   [("action", "restart", 10), ("lifecycle", "run_completed", 40)])  # fmt: skip
    with open(stalled.plan) as f:
        lines = [json.loads(line) for line in f]
    lines[1].update(reason="stall", notes="stall: stall at step 10; resuming from checkpoint-10")
    stalled.plan.write_text("".join(json.dumps(p) + "\n" for p in lines))
    why = external.clean_run_problem(stalled, 8.0)
    assert why is not None and "restarted 1 time(s) on its own (stall: stall at step 10)" in why
    assert "--hang-floor 8 s" in why and "give --hang-floor above" in why

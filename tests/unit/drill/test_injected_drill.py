"""`drill --supervise --inject`: the faults done inside the tool's HF Trainer, and what recovery means
there."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from steadytune.cli.main import build_parser
from steadytune.cli.main import main as cli
from steadytune.drill import external
from steadytune.drill.command import SuperviseLine, supervise_argv
from steadytune.drill.faults import catalogue as native_catalogue
from steadytune.drill.faults import parse_inject
from steadytune.records import PlanRevision, StepRecord, to_json
from steadytune.rundir import RunDir
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.stream import JsonlWriter

LINE = SuperviseLine("--resume_from_checkpoint {checkpoint}", "--learning_rate {lr}", 8.0, Path("/c.yaml"),
                     python="py", inject=True)  # fmt: skip
JOB = ["t.py", "--output_dir", "{output_dir}", "--max_steps", "40", "--save_steps", "10"]


def test_inside_faults_are_the_native_catalogues_own_specs() -> None:
    known = external.catalogue(10, inject=True)
    native = native_catalogue(10)
    assert known["nan"] == native["nan"] and known["spike"] == native["spike"]
    assert (known["nan"].env, known["spike"].at_step) == ({"nan_at_step": 25}, 31)
    assert set(known) == {"nan", "spike", *external.catalogue(10)}
    assert "nan" not in external.catalogue(10)  # without the guard there is no hook inside
    (nan,) = parse_inject("nan@33", 10, known)
    assert nan.env == {"nan_at_step": 33} and nan.in_process


def test_the_fault_is_in_the_supervised_environment_and_only_its_own() -> None:
    mine = {"PATH": "/bin", "STEADYTUNE_FAULTS": '{"hang_at_step": 3}'}
    nan = native_catalogue(10)["nan"]
    assert json.loads(external.fault_env(nan, mine)["STEADYTUNE_FAULTS"]) == {"nan_at_step": 25}
    assert external.fault_env(None, mine) == {"PATH": "/bin"}  # the clean run gets none of the caller's
    assert "STEADYTUNE_FAULTS" not in external.fault_env(external.catalogue(10)["kill"], mine)


def test_only_the_lr_faults_rollback_undoes_1000x() -> None:
    known = external.catalogue(10, inject=True)
    assert external.fault_overrides(known["lr"]) == ("policy.rollback_lr_scale=0.001",)
    assert external.fault_overrides(known["spike"]) == ()  # the policy's own scale lowers the job's LR
    assert "policy.rollback_lr_scale" not in external.drill_overrides()


def test_the_supervise_line_asks_for_injection() -> None:
    argv = supervise_argv(LINE, ["py", "t.py"], Path("/o"), Path("/r"), "nan-1", 2e-3)
    args = build_parser("supervise").parse_args(argv[3:])
    assert args.inject and args.cmd[-2:] == ["py", "t.py"]
    plain = SuperviseLine(LINE.resume_arg, LINE.lr_arg, 8.0, python="py")
    assert (
        not build_parser("supervise")
        .parse_args(supervise_argv(plain, ["t.py"], Path("/o"), Path("/r"), "k")[3:])
        .inject
    )


@pytest.mark.parametrize(
    ("words", "inject", "faults"),
    [
        (["--supervise", "--inject", "--faults", "nan,spike"], True, "nan,spike"),
        (["--supervise", "--inject", "nan"], True, "nan"),  # a value after --inject is the faults
        (["--supervise", "--inject"], True, None),
        (["--supervise", "--faults", "kill"], False, "kill"),
        (["--inject", "nan,oom"], False, "nan,oom"),  # the native drill's older spelling of --faults
    ],
)
def test_inject_is_a_switch_and_faults_a_list(words: list[str], inject: bool, faults: str | None) -> None:
    from steadytune.cli.drill import fault_words

    args = build_parser("drill").parse_args(["drill", *words, "--", "t.py"])
    assert fault_words(args) == faults
    assert (args.supervise and args.inject is not None) == inject
    assert args.words == ["t.py"]


def test_faults_given_twice_or_a_bare_native_inject_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["drill", "--supervise", "--inject", "nan", "--faults", "spike", "--", *JOB]) == 2
    assert "faults given twice" in capsys.readouterr().err
    assert cli(["drill", "--inject"]) == 2
    assert "--inject alone is for --supervise" in capsys.readouterr().err


def test_oom_is_refused_with_what_the_injected_guard_does_instead(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc = cli(["drill", "--supervise", "--inject", "--faults", "nan,oom,kill-during-save", "--runs-dir",
              str(tmp_path), "--", *JOB, "--learning_rate", "1e-3"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "2 problem(s)" in err
    assert "oom: the injected guard does not split the tool's micro-batch" in err
    assert "per_device_train_batch_size" in err and "kill-during-save: a save is over" in err
    assert not any(tmp_path.iterdir())


def test_without_inject_the_refusal_names_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert (
        cli(["drill", "--supervise", "--faults", "nan,spike", "--runs-dir", str(tmp_path), "--", *JOB]) == 2
    )
    assert "give --inject to drill nan, spike inside an HF Trainer-based tool" in capsys.readouterr().err


def test_spike_needs_the_jobs_lr_and_a_late_fault_is_said(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc = cli(["drill", "--supervise", "--inject", "--faults", "spike,nan@45", "--runs-dir", str(tmp_path),
              "--", *JOB])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "2 problem(s)" in err
    assert "spike fault's rollback lowers the command's learning rate" in err
    assert "before fault(s) nan@45" in err


def _run(tmp_path: Path, attempts: list[tuple[str | None, float, dict[int, float]]],
         events: list[tuple[str, str, int, dict]]) -> RunDir:  # fmt: skip
    """A run directory as supervise --inject leaves it: per attempt its plan, its steps' LRs; then events."""
    run = RunDir(tmp_path / "run").create()
    steps, t = JsonlWriter(run.telemetry(0)), 1000.0
    log = EventLog(run.events, "run", audit=False)
    for attempt, (resume, scale, lrs) in enumerate(attempts):
        plan = PlanRevision(revision=attempt, ts=t, reason="start" if attempt == 0 else "loss_spike",
                            attempt=attempt, resume_checkpoint=resume, lr_scale=scale)  # fmt: skip
        with open(run.plan, "a") as f:
            f.write(to_json(plan) + "\n")
        for step, lr in lrs.items():
            t += 1.0
            steps.write(StepRecord(step=step, ts=t, attempt=attempt, loss=2.0, lr=lr))
    for kind, name, step, data in events:
        log.emit(kind, name, name, step=step, data=data)
    return run


def _cmd(*tail: str) -> dict:
    return {"cmd": ["py", "t.py", "--learning_rate", "0.002", *tail]}


def _outcome(run: RunDir, **kw: object) -> external.Outcome:
    base = {
        "state": "completed",
        "returncode": 0,
        "fault_ts": None,
        "inject": True,
        "line": LINE,
        "base_lr": 2e-3,
    }
    return external.Outcome(run, run.root / "out", **{**base, **kw})  # type: ignore[arg-type]


SPIKE = native_catalogue(10)["spike"]  # burst x1000 at steps 31..33
BEFORE = {30: 5.5e-4, 31: 0.5, 32: 0.45}  # attempt 0: the schedule, times the burst from 31


def test_a_spike_is_recovered_only_when_the_optimizer_trained_at_the_lowered_lr(tmp_path: Path) -> None:
    def spike_run(after: dict[int, float], *tail: str) -> RunDir:
        path = tmp_path / str(len(list(tmp_path.iterdir())))
        path.mkdir()
        ck = "/o/checkpoint-30"
        return _run(
            path,
            [(None, 1.0, BEFORE), (ck, 0.5, after)],
            [
                ("lifecycle", "worker_started", 0, _cmd()),
                ("lifecycle", "worker_started", 32, _cmd("--resume_from_checkpoint", ck, *tail)),
            ],
        )

    lowered = spike_run({31: 2.5e-4, 32: 2.25e-4}, "--learning_rate", "0.001")
    assert external.lr_lowered(SPIKE, _outcome(lowered))
    # The command said 0.001, but the scheduler came back from the checkpoint at the old rate.
    kept = spike_run({31: 5e-4, 32: 4.5e-4}, "--learning_rate", "0.001")
    assert not external.lr_lowered(SPIKE, _outcome(kept))
    # Without --inject there is no optimizer reading: the command line is what can be checked.
    assert external.lr_lowered(SPIKE, _outcome(kept, inject=False))
    unsaid = spike_run({31: 2.5e-4, 32: 2.25e-4})  # supervise had no LR argument to give
    assert not external.lr_lowered(SPIKE, _outcome(unsaid))
    assert not external.lr_lowered(SPIKE, _outcome(_run(tmp_path / "x", [(None, 1.0, BEFORE)], [])))


def test_an_injected_sigterm_must_leave_a_checkpoint_of_the_step_it_stopped_on(tmp_path: Path) -> None:
    spec = external.catalogue(10, inject=True)["sigterm"]
    stopped = {"state": "stopped", "returncode": 128 + signal.SIGTERM, "fault_ts": 1.0}
    saved = _run(
        tmp_path / "a",
        [(None, 1.0, {25: 1e-3, 26: 1e-3})],
        [("lifecycle", "checkpoint_saved", 26, {}), ("lifecycle", "run_stopped", 26, {})],
    )
    assert external.usable(spec, _outcome(saved, **stopped))
    earlier = _run(
        tmp_path / "b",
        [(None, 1.0, {25: 1e-3, 26: 1e-3})],
        [("lifecycle", "checkpoint_saved", 20, {}), ("lifecycle", "run_stopped", 26, {})],
    )
    assert not external.usable(spec, _outcome(earlier, **stopped))
    assert external.usable(spec, _outcome(earlier, **stopped, inject=False))  # a plain job: its own saving


def test_a_nan_that_needed_a_restart_was_not_handled_inside(tmp_path: Path) -> None:
    spec = external.catalogue(10, inject=True)["nan"]
    restarted = _run(tmp_path, [(None, 1.0, {24: 1e-3, 25: 1e-3}), ("/o/checkpoint-20", 1.0, {21: 1e-3})], [])
    assert not external.usable(spec, _outcome(restarted))

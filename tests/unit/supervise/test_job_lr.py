"""Which LR a supervised command's rollback scales: the user's --base-lr, else the command's own LR
argument, else the highest LR the job logged (its base LR, not its schedule's value at the trouble),
never a config's LR that is not the job's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.records import PlanRevision
from steadytune.rundir import RunDir
from steadytune.supervise.command import PRESETS, CommandOptions, CommandSource, command_lr
from steadytune.supervise.job_lr import choose_base_lr, lr_flag


def test_base_lr_given_by_the_user_wins() -> None:
    assert choose_base_lr(1e-4, (3e-4, "--learning_rate"), 2e-5, 2e-3).lr == 1e-4  # type: ignore[union-attr]


def test_the_commands_own_lr_wins_over_what_it_logged() -> None:
    got = choose_base_lr(None, (2e-3, "--learning_rate"), 8e-4, None)  # logged: the decayed schedule
    assert got is not None and (got.lr, got.source) == (2e-3, "command")
    assert got.said() == "the command's --learning_rate"


def test_the_logged_lr_wins_over_a_config_that_is_not_the_jobs_and_says_so() -> None:
    got = choose_base_lr(None, None, 2e-5, 2e-3)
    assert got is not None and got.lr == 2e-5 and got.source == "logged"
    assert "0.002" in got.note and "100x" in got.note


def test_a_config_close_to_the_logged_lr_is_not_called_wrong() -> None:
    got = choose_base_lr(None, None, 1.5e-5, 2e-5)
    assert got is not None and got.lr == 1.5e-5 and got.note == ""


def test_without_a_logged_lr_the_config_stands_and_without_either_there_is_none() -> None:
    assert choose_base_lr(None, None, None, 2e-3).source == "config"  # type: ignore[union-attr]
    assert choose_base_lr(None, None, 0.0, 2e-3).source == "config"  # type: ignore[union-attr]
    assert choose_base_lr(None, None, float("nan"), None) is None
    assert choose_base_lr(None, None, None, None) is None


@pytest.mark.parametrize(
    ("template", "flag"),
    [
        ("--learning_rate {lr}", "--learning_rate"),
        ("learning_rate={lr}", "learning_rate"),
        ("--learning-rate={lr}", "--learning-rate"),
        ("--lr {lr}", "--lr"),
        ("{lr}", None),
        ("--fixed 1", None),
        (None, None),
    ],
)
def test_the_lr_argument_a_template_sets(template: str | None, flag: str | None) -> None:
    assert lr_flag(template) == flag


def test_the_commands_lr_is_read_where_each_preset_would_set_it() -> None:
    trl = ["trl", "sft", "--output_dir", "o", "--learning_rate", "2e-3", "--max_steps", "40"]
    assert command_lr(trl, PRESETS["trl"]["lr_arg"]) == (2e-3, "--learning_rate")
    hf = ["python", "train.py", "--learning-rate=1e-4"]
    assert command_lr(hf, PRESETS["hf"]["lr_arg"]) == (1e-4, "--learning_rate")
    lf = ["llamafactory-cli", "train", "sft.yaml", "learning_rate=5e-5"]
    assert command_lr(lf, PRESETS["llamafactory"]["lr_arg"]) == (5e-5, "learning_rate")
    axolotl = ["axolotl", "train", "c.yml", "--learning-rate=3e-5"]
    assert command_lr(axolotl, PRESETS["axolotl"]["lr_arg"]) == (3e-5, "--learning-rate")
    assert command_lr(["trl", "sft"], PRESETS["trl"]["lr_arg"]) is None  # the tool's default: not known here
    assert command_lr(["trl", "sft", "--learning_rate", "auto"], PRESETS["trl"]["lr_arg"]) is None
    assert command_lr(trl, None) is None


def _source(tmp_path: Path, **opts: object) -> CommandSource:
    p = PRESETS["hf"]
    o = CommandOptions(["true"], tmp_path / "o", p["resume_arg"], p["lr_arg"], **opts)  # type: ignore[arg-type]
    return CommandSource(o, RunDir(tmp_path / "run").create(), clock=lambda: 0.0)


def _logs(source: CommandSource, *lrs: float) -> None:
    for lr in lrs or (2e-5,) * 3:
        source.adapter.on_stdout(
            str({"loss": 1.0, "grad_norm": 1.0, "learning_rate": lr, "epoch": 0.1}) + "\n"
        )


def _plan(attempt: int, scale: float) -> PlanRevision:
    return PlanRevision(revision=attempt, ts=0.0, reason="rollback", attempt=attempt, lr_scale=scale)


def _events(tmp_path: Path) -> list[dict]:
    rows = [
        json.loads(x) for x in (tmp_path / "run").rglob("rank-0*.jsonl").__next__().read_text().splitlines()
    ]
    return [r for r in rows if r.get("name") == "rollback_lr"]


def test_a_rollback_lowers_the_lr_the_job_ran_at_not_the_configs(tmp_path: Path) -> None:
    source = _source(tmp_path, config_lr=2e-3)
    _logs(source, 2e-5, 2e-5, 2e-5)
    assert source.command_for(_plan(1, 0.5))[-2:] == ["--learning_rate", "1e-05"]


def test_a_rollback_scales_the_peak_of_a_warm_up_and_decay_not_the_decayed_lr(tmp_path: Path) -> None:
    source = _source(tmp_path)
    _logs(source, 1e-4, 2e-4, 4e-4, 3e-4, 2e-4, 1e-4)  # warm-up to the base LR 4e-4, then decay
    base = source.base_lr()
    assert base is not None and (base.lr, base.source) == (4e-4, "logged")
    assert source.command_for(_plan(1, 0.5))[-2:] == ["--learning_rate", "0.0002"]


def test_a_rollback_scales_the_commands_own_lr_when_it_gives_one(tmp_path: Path) -> None:
    p = PRESETS["trl"]
    o = CommandOptions(["true", "--learning_rate", "2e-3"], tmp_path / "o", p["resume_arg"], p["lr_arg"])
    source = CommandSource(o, RunDir(tmp_path / "run").create(), clock=lambda: 0.0)
    _logs(source, 2e-3, 1.5e-3, 1e-3, 8e-4)  # a linear decay, logged to the trouble
    assert source.command_for(_plan(1, 0.5))[-2:] == ["--learning_rate", "0.001"]
    source.start(_plan(1, 0.5), tmp_path / "w.log").proc.wait()
    source.settle()
    [said] = _events(tmp_path)
    assert "x0.5 of the command's --learning_rate (0.002)" in said["message"]


def test_a_second_rollback_scales_the_jobs_own_lr_not_the_lowered_one(tmp_path: Path) -> None:
    source = _source(tmp_path, config_lr=2e-3)
    _logs(source, 2e-5, 2e-5, 2e-5)
    source.start(_plan(1, 0.5), tmp_path / "w.log").proc.wait()
    source.settle()
    _logs(source, 1e-5, 1e-5, 1e-5)  # the lowered attempt logs its lowered LR
    assert source.command_for(_plan(2, 0.25))[-2:] == ["--learning_rate", "5e-06"]
    [said] = _events(tmp_path)
    assert "1e-05" in said["message"] and "0.002" in said["message"]


def test_the_users_base_lr_is_scaled_whatever_the_job_logged(tmp_path: Path) -> None:
    source = _source(tmp_path, base_lr=4e-5, config_lr=2e-3)
    _logs(source, 2e-5, 2e-5)
    assert source.command_for(_plan(1, 0.5))[-2:] == ["--learning_rate", "2e-05"]


def test_without_any_lr_known_a_rollback_cannot_lower_it(tmp_path: Path) -> None:
    source = _source(tmp_path)
    assert "lr" not in source.abilities
    _logs(source, 2e-5, 2e-5)
    assert "lr" in source.abilities


# A job with a warm-up and decay from its base LR (--learning_rate, the last one given, else 2e-05)
# that saves every 5 steps and diverges at step 25; resumed, it trains on.
JOB = """
import json, pathlib, struct, sys, time
out = pathlib.Path(sys.argv[1])
at = sys.argv.index("--resume_from_checkpoint") + 1 if "--resume_from_checkpoint" in sys.argv else 0
start = int(sys.argv[at].rsplit("-", 1)[1]) if at else 0
given = [sys.argv[i + 1] for i, w in enumerate(sys.argv) if w == "--learning_rate"]
base = float(given[-1]) if given else 2e-05
for s in range(start + 1, 41):
    lr = base * (s / 5 if s <= 5 else (40 - s) / 35)
    loss = 2.0 - s / 100 if at or s < 25 else 50.0 * (s - 23)
    print({"loss": loss, "grad_norm": 1.0, "learning_rate": lr, "epoch": s / 40}, flush=True)
    if s % 5 == 0 and (at or s < 25):
        ck = out / f"checkpoint-{s}"
        ck.mkdir(parents=True, exist_ok=True)
        raw = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
        (ck / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(16))
        (ck / "trainer_state.json").write_text(json.dumps({"global_step": s}))
    time.sleep(0.05)
if not at:
    time.sleep(120)
"""


@pytest.mark.parametrize(
    ("job_args", "source"),
    [
        ((), "the highest LR the job logged (2e-05)"),
        (("--learning_rate", "2e-05"), "the command's --learning_rate (2e-05)"),
    ],
)
def test_a_supervised_rollback_runs_the_resumed_steps_at_half_the_lr_they_ran_at(
    tmp_path: Path, stdlib_python: str, job_args: tuple[str, ...], source: str
) -> None:
    import subprocess

    from tests.conftest import STEADYTUNE

    (tmp_path / "job.py").write_text(JOB)
    cfg = tmp_path / "my.yaml"
    cfg.write_text("train:\n  learning_rate: 0.002\n")  # steadytune demo --print-config's LR, not the job's
    out = tmp_path / "out"
    proc = subprocess.run(
        [STEADYTUNE, "supervise", "--config", str(cfg), "--preset", "hf", "--output-dir", str(out),
         "--runs-dir", str(tmp_path / "runs"), "--run-id", "r1", "--",
         stdlib_python, str(tmp_path / "job.py"), str(out), *job_args],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "runs" / "r1"
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert any(e["name"] == "rollback" for e in events), [e["name"] for e in events]
    restarted = [e for e in events if e["name"] == "worker_started"][-1]
    assert restarted["data"]["cmd"][-2:] == ["--learning_rate", "1e-05"]
    [said] = [e for e in events if e["name"] == "rollback_lr"]
    assert f"x0.5 of {source}" in said["message"], said["message"]
    rows = [json.loads(x) for f in sorted(run.rglob("rank-0*.jsonl")) for x in f.read_text().splitlines()]
    lr = {(r["attempt"], r["step"]): r["lr"] for r in rows if r.get("lr") is not None and "step" in r}
    resumed = min(step for attempt, step in lr if attempt == 1)
    assert resumed == 21  # checkpoint-20, the last before the divergence at 25
    assert lr[(1, resumed)] == pytest.approx(0.5 * lr[(0, resumed)], rel=1e-3)

"""The end-of-run summary's "next:" lines: real commands, the one for anomalies showing those raised live."""

from __future__ import annotations

import io
import shlex
import types
from pathlib import Path

from steadytune.cli._common import console
from steadytune.cli.main import parse
from steadytune.cli.run import PlainProgress, loss_change, print_summary
from steadytune.rundir import RunDir


def test_next_offers_replay_for_the_anomalies_raised_live_and_each_command_parses(tmp_path: Path) -> None:
    # A path longer than a piped console's 160 columns, with a space and brackets: each line stays whole
    # and quoted (a long test folder once wrapped the replay line's path onto a line of its own).
    run = RunDir(tmp_path / ("deep-" * 30) / "my runs [v2]" / "r1").create()
    progress = types.SimpleNamespace(first_loss=None, last_loss=None, step=0, max_steps=0,
                                     last_eval_loss=None, tokens_per_s=None, skipped_steps=0)  # fmt: skip
    result = types.SimpleNamespace(progress=progress, state="completed", reason="done", checkpoints=[],
                                   restarts=0, wall_s=1.0, run=run)  # fmt: skip
    buf = io.StringIO()
    print_summary(console(file=buf), result)
    after = buf.getvalue().split("\nnext:\n", 1)[1].splitlines()
    commands = [shlex.split(line, comments=True) for line in after if line.strip().startswith("steadytune ")]
    for argv in commands:
        parse(argv[1:])  # exits (fails the test) on a command the CLI does not take
    live = next(line for line in after if "raised live" in line)
    assert shlex.split(live, comments=True) == ["steadytune", "replay", str(run.root)]


def _summary(run: RunDir, state: str, cfg: object) -> list[str]:
    progress = types.SimpleNamespace(first_loss=None, last_loss=None, step=5, max_steps=40,
                                     last_eval_loss=None, tokens_per_s=None, skipped_steps=0)  # fmt: skip
    result = types.SimpleNamespace(progress=progress, state=state, reason="r", checkpoints=[],
                                   restarts=0, wall_s=1.0, run=run)  # fmt: skip
    buf = io.StringIO()
    print_summary(console(file=buf), result, cfg)  # type: ignore[arg-type]
    return buf.getvalue().split("\nnext:\n", 1)[1].splitlines()


def test_next_says_how_to_resume_a_stopped_or_failed_run_of_its_own_worker(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "my runs" / "r1").create()
    cfg = types.SimpleNamespace(train=types.SimpleNamespace(save_steps=None))
    for state in ("stopped", "failed"):
        first = _summary(run, state, cfg)[0]
        assert shlex.split(first, comments=True) == ["steadytune", "resume", str(run.root)]
    assert not any("steadytune resume" in line for line in _summary(run, "completed", cfg))
    # A watched command is started again by its own command line.
    assert not any("steadytune resume" in line for line in _summary(run, "stopped", None))


def test_the_loss_row_gives_a_share_only_of_a_loss_that_started_above_zero_and_fell_towards_it() -> None:
    assert loss_change(6.1849, 2.0982) == "6.1849 → 2.0982 (66% lower)"
    assert loss_change(2.0, 2.5) == "2.0000 → 2.5000"  # rose: no share
    # A GRPO run's loss starts at 0 (rewards tied, or a policy still equal to its reference) and may go
    # negative: no share of it means anything (it read "(230137129% lower)" and "(257% lower)").
    assert loss_change(1.043e-07, -0.2401) == "0.0000 → -0.2401"
    assert loss_change(1.043e-07, -1.6e-07) == "0.0000 → -0.0000"
    assert loss_change(0.6931, -0.1) == "0.6931 → -0.1000"  # a loss that crossed 0
    assert loss_change(None, 1.0) == "-"


def test_a_grpo_runs_summary_says_no_share_of_its_loss(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r1").create()
    progress = types.SimpleNamespace(first_loss=1.043e-07, last_loss=-0.2401, step=20, max_steps=20,
                                     last_eval_loss=None, tokens_per_s=None, skipped_steps=0)  # fmt: skip
    result = types.SimpleNamespace(progress=progress, state="completed", reason="r", checkpoints=[],
                                   restarts=1, wall_s=1.0, run=run)  # fmt: skip
    buf = io.StringIO()
    print_summary(console(file=buf), result)
    row = next(line for line in buf.getvalue().splitlines() if "loss first" in line)
    assert row.split() == ["loss", "first", "→", "last", "0.0000", "→", "-0.2401"]


def test_the_plain_progress_line_is_printed_every_10s_and_only_when_it_changed() -> None:
    buf, now = io.StringIO(), [0.0]
    live = PlainProgress(console(file=buf), clock=lambda: now[0])
    waiting = "step 0 | loss - | tok/s - | ETA - | mem -"
    for t, line in ((0, waiting), (4, waiting), (10, waiting), (20, waiting), (25, "step 3 | loss 1.2"),
                    (30, "step 3 | loss 1.2"), (31, "step 5 | loss 1.1"), (40, waiting)):  # fmt: skip
        now[0] = float(t)
        live.update(line)
    # A loading (or resuming) job's line that stands still was printed once, not every 10 s.
    assert buf.getvalue().splitlines() == [waiting, "step 3 | loss 1.2", waiting]


def test_the_summary_names_each_alert_sink_that_missed_alerts(tmp_path: Path) -> None:
    # The console said nothing of undelivered alerts: they sat in events.jsonl only.
    from steadytune.alerts.router import AlertRouter
    from steadytune.config.alerts import AlertsConfig
    from steadytune.records import Event
    from steadytune.telemetry.events import EventLog

    run = RunDir(tmp_path / "runs" / "r1").create()
    (run.root / "a-folder").mkdir()
    config = AlertsConfig.model_validate(
        {"retry": {"attempts": 1}, "sinks": [{"type": "jsonl", "path": "ok.jsonl"},
                                              {"type": "jsonl", "path": "a-folder"}]}
    )  # fmt: skip
    log = EventLog(run.events, run_id="r1")
    router = AlertRouter(config, log, run_id="r1")
    log.on_append = router
    for step, name in ((3, "loss_spike"), (9, "grad_explosion")):
        log.append(Event(ts=float(step), kind="anomaly", name=name, severity="critical", step=step,
                         message=name, data={"metric": "loss" if step == 3 else "grad_norm"}))  # fmt: skip
    router.close(timeout=10)
    buf = io.StringIO()
    progress = types.SimpleNamespace(first_loss=None, last_loss=None, step=9, max_steps=9,
                                     last_eval_loss=None, tokens_per_s=None, skipped_steps=0)  # fmt: skip
    result = types.SimpleNamespace(progress=progress, state="completed", reason="r", checkpoints=[],
                                   restarts=0, wall_s=1.0, run=run)  # fmt: skip
    print_summary(console(file=buf), result)
    lines = [line.strip() for line in buf.getvalue().split("\nnext:\n", 1)[0].splitlines()]
    missed = [line for line in lines if line.startswith("alerts:")]
    assert len(missed) == 1, lines
    assert missed[0].startswith("alerts: jsonl#1 missed 2 of 2: cannot append to ")
    assert "a-folder" in missed[0] and "jsonl#1: jsonl#1" not in missed[0]

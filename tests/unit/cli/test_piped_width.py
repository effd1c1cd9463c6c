"""Written to a pipe or a log, a command's tables are laid out wide and never cut a number in two."""

from __future__ import annotations

import io

import pytest

from steadytune.cli._common import PIPE_WIDTH, console
from steadytune.detect.report import FileResult, render_text
from steadytune.records import Anomaly


def _result() -> FileResult:
    ev = {"value": 9.251234, "baseline": 1.000321, "ratio": 9.25123, "threshold_ratio": 1.14, "points_up": 1}
    anomalies = [
        Anomaly(
            kind,
            "warning",
            1200,
            1204,
            "train/grad_norm_of_the_whole_model",
            ev,
            "c",
            "s",
            count=2,
            peak=9.25,
        )
        for kind in ("grad_spike", "throughput_drop")
    ]
    return FileResult(
        "/some/rather/long/path/to/a/training/log/trainer_state.json", "hf", 5000, ["loss"], anomalies
    )


def test_a_pipe_gets_the_wide_width_and_every_evidence_token_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    out = console(file=buf)
    assert out.width == PIPE_WIDTH
    render_text([_result()], out)
    text = buf.getvalue()
    for token in ("value=9.251234,", "baseline=1.000321,", "ratio=9.25123,", "threshold_ratio=1.14"):
        assert token in text


def test_columns_and_an_explicit_width_still_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert console(file=io.StringIO()).width == 100
    monkeypatch.delenv("COLUMNS")
    assert console(file=io.StringIO(), width=90).width == 90


def test_the_header_names_the_judged_series_first_and_how_many_more(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    logged = ["loss", "learning_rate", "num_tokens", "completions/mean_length", "completions/min_length",
              "completions/max_length", "clip_frac", "entropy", "reward", "reward_std", "epoch"]  # fmt: skip
    result = FileResult("grpo/trainer_state.json", "hf", 40, logged, [], objective="RL (GRPO/RLOO)")
    buf = io.StringIO()
    render_text([result], console(file=buf))
    head = buf.getvalue().splitlines()[0]
    assert "steps; reward, reward_std, loss, " in head and head.count(",") == 1 + 5
    assert "and 5 more" in head
    sft = FileResult("sft.jsonl", "hf", 40, ["epoch", "learning_rate", "grad_norm", "loss"], [])
    buf = io.StringIO()
    render_text([sft], console(file=buf))
    assert "loss, grad_norm, epoch, learning_rate)" in buf.getvalue() and "more" not in buf.getvalue()

"""Which series is the loss: one rule (series.LossChoice) for every reader and for supervise.

Generated logs in real layouts: a script's ``[step N] loss=X`` text with a stray
``[step N] avg_loss=0.0000`` every tenth step, HF Trainer dicts on stdout, JSON lines;
and the same dicts read live by the log adapter.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from steadytune.detect import detect
from steadytune.importers import load
from steadytune.importers.series import LossChoice
from steadytune.protocol import WorkerEvent
from steadytune.records import Event, StepRecord
from steadytune.rundir import RunDir
from steadytune.supervise.log_adapter import LogAdapter
from steadytune.telemetry.stream import JsonlWriter, iter_records

N = 200


def _losses(seed: int = 4) -> list[float]:
    """A DPO-like loss: from ln 2 down, noisy; never near zero."""
    rng = random.Random(seed)
    return [0.69 * (0.6 + 0.4 * math.exp(-i / 60)) * math.exp(rng.gauss(0, 0.05)) for i in range(N)]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_stray_zero_avg_loss_every_tenth_step_is_ignored_once_and_never_judged(tmp_path: Path) -> None:
    losses = _losses()
    lines = []
    for i, x in enumerate(losses, 1):
        lines.append(f"[step {i}] loss={x:.4f}")
        if i % 10 == 0:
            lines.append(f"[step {i}] avg_loss=0.0000")  # a logging bug: always exactly zero
    s = load(_write(tmp_path / "dpo.log", lines))
    assert s.format == "text_log"
    steps, values = s.values("loss")
    assert steps == list(range(1, N + 1)) and min(values) > 0.3
    assert s.notes == ["ignored `avg_loss`: always 0.0000 while `loss` varies"]
    assert not [a for a in detect(s.records) if a.kind == "loss_collapse"]


@pytest.mark.parametrize("layout", ["hf_dicts", "jsonl"])
def test_a_constant_loss_field_beside_a_varying_one_is_not_the_loss(tmp_path: Path, layout: str) -> None:
    """A script whose ``loss`` key is stuck at 0.0 while ``train_loss`` moves: train_loss is the loss."""
    losses = _losses(seed=9)
    if layout == "hf_dicts":
        lines = [
            f"{{'loss': 0.0, 'train_loss': {x:.4f}, 'grad_norm': 1.2, 'learning_rate': 1e-05, 'step': {i}}}"
            for i, x in enumerate(losses, 1)
        ]
        path = _write(tmp_path / "stdout.log", lines)
    else:
        rows = [{"step": i, "loss": 0.0, "train_loss": round(x, 4)} for i, x in enumerate(losses, 1)]
        path = _write(tmp_path / "metrics.jsonl", [json.dumps(r) for r in rows])
    s = load(path)
    assert s.format == ("dict_log" if layout == "hf_dicts" else "jsonl_log")
    _, values = s.values("loss")
    assert values == pytest.approx([round(x, 4) for x in losses])
    assert s.notes == ["ignored `loss`: always 0.0000 while `train_loss` varies"]
    assert not [a for a in detect(s.records) if a.kind in ("loss_collapse", "plateau")]


def test_one_loss_under_another_name_is_the_loss_and_nothing_is_said(tmp_path: Path) -> None:
    lines = [f"step {i} | train loss {x:.4f}" for i, x in enumerate(_losses(seed=2), 1)]
    s = load(_write(tmp_path / "train.log", lines))
    assert len(s.values("loss")[0]) == N and s.notes == []


def test_the_rule_prefers_the_loss_of_the_step_to_a_running_mean() -> None:
    choice = LossChoice()
    for i in range(5):
        choice.see("avg_loss", 2.0 - 0.1 * i)
        choice.see("loss", 2.1 - 0.1 * i)
    assert choice.chosen() == "loss" and choice.notes() == {}
    flat = LossChoice()
    flat.see("loss", 0.7)
    flat.see("loss", 0.7)  # a frozen run: nothing else varies, so nothing is ignored
    assert flat.chosen() == "loss" and flat.ignored() == {}


def test_supervise_chooses_the_same_loss_and_says_so_once(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run").create()
    writer = JsonlWriter(run.telemetry(0))
    adapter = LogAdapter(writer, ["python", "train.py", "--logging_steps", "10"], None, clock=lambda: 0.0)
    losses = _losses(seed=11)[:30]
    for x in losses:
        adapter.on_stdout(f"{{'loss': 0.0, 'train_loss': {x:.4f}, 'grad_norm': 1.1, 'learning_rate': 1e-05}}")
    writer.close()
    recs = [r for r in iter_records(run.telemetry(0)) if isinstance(r, StepRecord)]
    # The first record has nothing to tell the two apart by: it carries no loss, rather than a 0.0.
    assert recs[0].loss is None
    assert [r.loss for r in recs][1:] == pytest.approx([round(x, 4) for x in losses][1:])
    notes = [e for e in iter_records(run.telemetry(0)) if isinstance(e, Event)]
    assert [(e.name, e.message) for e in notes if e.name == WorkerEvent.LOSS_FIELD_IGNORED] == [
        (WorkerEvent.LOSS_FIELD_IGNORED, "ignored `loss`: always 0.0000 while `train_loss` varies")
    ]

"""JSON documents, JSON lines that count their steps their own way, and renamed TensorBoard files.

Each log is written by a seeded loop in the test, with an anomaly at a known step.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from steadytune.detect.offline import replay_runs
from steadytune.importers import detect_format, load


def _found(path: Path) -> set[tuple[str, int, str]]:
    s = load(path)
    return {
        (a.kind, a.start_step, a.evidence.get("run", "")) for a in replay_runs(s.runs(), s.system).anomalies
    }


def _grpo_rows(n: int, seed: int, nan_grad_at: int | None = None) -> list[dict[str, float]]:
    """What TRL's GRPOTrainer logs per step (its log_history entries)."""
    rng = random.Random(seed)
    rows = []
    for step in range(1, n + 1):
        reward = 0.2 + 0.5 * (1 - math.exp(-4 * step / n)) + rng.gauss(0, 0.03)
        rows.append(
            {
                "loss": rng.gauss(0, 0.01),
                "grad_norm": math.nan if step == nan_grad_at else 0.5 + 0.1 * rng.random(),
                "learning_rate": 5e-6,
                "reward": reward,
                "reward_std": 0.2,
                "frac_reward_zero_std": 0.1,
                "kl": 0.001 * step,
                "epoch": step / n,
                "step": step,
            }
        )
    return rows


@pytest.mark.parametrize("seed", range(3))
def test_a_json_list_of_log_dicts_holding_two_runs(tmp_path: Path, seed: int) -> None:
    first, second = _grpo_rows(20, seed), _grpo_rows(20, seed + 1, nan_grad_at=5)
    summary = {"train_runtime": 1374.5, "train_loss": 0.03, "epoch": 1.0, "step": 20}
    p = tmp_path / "training_log.json"
    p.write_text(json.dumps([*first, summary, *second, summary], indent=2))
    assert detect_format(p) == "json_document"
    s = load(p)
    runs = s.runs()
    assert [[r.step for r in run.records] for run in runs] == [list(range(1, 21))] * 2
    assert runs[1].records[4].extra["reward"] == second[4]["reward"] and math.isnan(
        runs[1].records[4].grad_norm
    )
    assert any("2 runs" in n for n in s.notes)
    assert ("nonfinite_grad", 5, "run 2 of 2") in _found(p)
    assert replay_runs(runs).objective == "RL (GRPO/RLOO)"


def test_a_document_holding_its_log_beside_copies_of_it_is_one_run(tmp_path: Path) -> None:
    rows = _grpo_rows(30, 3)
    doc = {
        "metadata": {"run_name": "dpo", "effective_batch_size": 64},
        "raw_log_history": rows,
        "scalar_series": {"loss": [{"step": r["step"], "loss": r["loss"]} for r in rows]},
        "train_loss": [{"step": r["step"], "loss": r["loss"]} for r in rows] + [{"step": 30, "loss": 0.5}],
    }
    p = tmp_path / "history.json"
    p.write_text(json.dumps(doc))
    s = load(p)
    assert len(s.runs()) == 1 and [r.step for r in s.records] == list(range(1, 31))
    assert s.records[3].loss == rows[3]["loss"]


@pytest.mark.parametrize("seed", range(3))
def test_series_of_points_side_by_side_are_runs(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    metrics: dict[str, list[dict[str, float]]] = {}
    for run in ("ALIGNED", "GAMING"):
        for step in range(1, 330, 10):
            loss = 0.69 * math.exp(-step / 200) + rng.gauss(0, 0.005)
            if run == "GAMING" and step == 201:
                loss = math.nan
            metrics.setdefault(f"{run}/loss", []).append({"step": step, "value": loss, "epoch": step / 160})
            metrics.setdefault(f"{run}/reward_margin", []).append({"step": step, "value": step / 100})
    p = tmp_path / "training_metrics.json"
    p.write_text(json.dumps({"metadata": {"personalities": ["A", "B"]}, "metrics": metrics}))
    s = load(p)
    assert [len(r.records) for r in s.runs()] == [33, 33]
    assert ("nan_loss", 201, "run 2 of 2") in _found(p)


def test_columns_of_numbers_are_a_metric_a_step(tmp_path: Path) -> None:
    loss = [2.0 - i / 50 for i in range(40)]
    p = tmp_path / "history.json"
    p.write_text(json.dumps({"loss": loss, "grad_norm": [1.0] * 40, "model": "gpt2"}))
    s = load(p)
    assert [(r.step, r.loss) for r in s.records][:2] == [(1, 2.0), (2, 1.98)]


# --- JSON lines ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_json_lines_counted_by_their_own_loop(tmp_path: Path, seed: int) -> None:
    """A GRPO loop's typed rows: an eval, a rollout and several optimizer steps per grpo_step."""
    rng = random.Random(seed)
    lines = [{"type": "eval", "grpo_step": 0, "optimizer_step": 0, "reward": 0.04, "answer_accuracy": 0.04}]
    for g in range(1, 61):
        lines.append(
            {"type": "rollout", "grpo_step": g, "reward": 0.3 + rng.gauss(0, 0.02), "std_reward": 0.3}
        )
        for k in range(2):
            grad = 400.0 if (g, k) == (41, 1) else 0.5 + 0.1 * rng.random()
            lines.append(
                {"type": "train", "grpo_step": g, "optimizer_step": 2 * g + k - 1, "loss": rng.gauss(0, 0.01),
                 "grad_norm": grad, "token_entropy": 0.5, "reference_kl": None}
            )  # fmt: skip
        lines.append(
            {"type": "grpo_step_summary", "grpo_step": g, "optimizer_step": 2 * g, "step_seconds": 30.1}
        )
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = load(p)
    assert [r.step for r in s.records] == list(range(61))
    assert s.records[0].extra["eval_reward"] == 0.04 and "optimizer_step" not in s.metrics
    g41 = s.records[41]
    assert g41.grad_norm == pytest.approx((lines[1 + 40 * 4 + 1]["grad_norm"] + 400.0) / 2)  # the step's mean
    assert "reward_std" in g41.extra  # std_reward: the spread of the batch's rewards
    assert replay_runs(s.runs()).objective.startswith("RL")
    assert any(kind in ("grad_spike", "grad_explosion") and step == 41 for kind, step, _ in _found(p))


def test_json_lines_that_count_nothing_are_numbered_by_their_rows(tmp_path: Path) -> None:
    rows = [
        {"logps_eval/chosen": -50.0 - i, "logps_eval/rejected": -49.0 - 2 * i, "energy": 0.6}
        for i in range(30)
    ]
    p = tmp_path / "probe.json"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = load(p)
    assert [r.step for r in s.records] == list(range(1, 31))
    assert s.records[2].extra["logps_eval/chosen"] == -52.0


# --- TensorBoard ---------------------------------------------------------------------------------


def test_a_renamed_tensorboard_file_is_known_by_its_content(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    w = EventFileWriter(str(tmp_path))
    for step in range(10, 310, 10):
        values = [
            Summary.Value(tag="train/reward", simple_value=0.5),
            Summary.Value(tag="train/loss", simple_value=0.01),
            Summary.Value(tag="train/grad_norm", simple_value=float("nan") if step == 200 else 0.4),
        ]
        w.add_event(Event(step=step, wall_time=float(step), summary=Summary(value=values)))
    w.close()
    (events,) = tmp_path.glob("events.out.tfevents*")
    renamed = events.rename(tmp_path / "run42__events.bin")
    assert detect_format(renamed) == "tensorboard"
    s = load(renamed)
    assert s.records[0].extra == {"reward": 0.5}  # TRL's name, without the callback's train/
    assert ("nonfinite_grad", 200, "") in _found(renamed)

"""CSV layouts other tools write, each generated in the test by a seeded loop: Lightning's
CSVLogger ``metrics.csv`` and W&B history exports."""

from __future__ import annotations

import csv
import math
import random
from pathlib import Path

import pytest

from steadytune.detect.offline import replay
from steadytune.importers import UnreadableLog, load

SPIKE_AT = 50


def _curve(n: int, seed: int, start: float = 10.9, end: float = 2.3) -> list[float]:
    """A falling loss with 1% noise and one spike, three times the loss, at ``SPIKE_AT``."""
    rng = random.Random(seed)
    losses = [end + (start - end) * math.exp(-i / (n / 6)) * (1 + 0.01 * rng.gauss(0, 1)) for i in range(n)]
    losses[SPIKE_AT] *= 3
    return losses


def _write(path: Path, header: list[str], rows: list[dict[str, object]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)  # absent keys are blank cells, as Lightning leaves them
        w.writeheader()
        w.writerows(rows)
    return path


def _spike_steps(path: Path) -> list[int]:
    return [a.start_step for a in replay(load(path).records).anomalies if a.metric == "loss"]


def _lightning(path: Path, losses: list[float], per_epoch: int, on_epoch: bool) -> Path:
    """metrics.csv of ``self.log("train_loss", ...)`` each step and ``self.log("val_loss", ...)``
    after each epoch: one row per call, other metrics blank; with ``on_epoch`` Lightning writes
    ``train_loss_step`` and an epoch mean ``train_loss_epoch`` row."""
    train = "train_loss_step" if on_epoch else "train_loss"
    header = ["epoch", "step", *(["train_loss_epoch"] if on_epoch else []), train, "val_loss"]
    rows: list[dict[str, object]] = []
    for step, loss in enumerate(losses):
        epoch = step // per_epoch
        rows.append({"epoch": epoch, "step": step, train: loss})
        if (step + 1) % per_epoch == 0:
            rows.append({"epoch": epoch, "step": step, "val_loss": loss * 1.02})
            if on_epoch:
                mean = sum(losses[step + 1 - per_epoch : step + 1]) / per_epoch
                rows.append({"epoch": epoch, "step": step, "train_loss_epoch": mean})
    return _write(path, header, rows)


def test_lightning_train_loss_is_the_loss_and_val_rows_merge_into_their_step(tmp_path: Path) -> None:
    losses = _curve(60, seed=3)
    p = _lightning(tmp_path / "metrics.csv", losses, per_epoch=20, on_epoch=False)
    s = load(p)
    assert s.steps == 60 and "train_loss" not in s.metrics
    assert s.values("loss") == (list(range(60)), losses)
    assert s.values("eval_loss") == ([19, 39, 59], [losses[i] * 1.02 for i in (19, 39, 59)])
    assert _spike_steps(p) == [SPIKE_AT]


@pytest.mark.parametrize("column", ["type", "split", "phase"])
def test_rows_typed_as_an_evaluation_hold_the_eval_loss_never_the_training_loss(
    tmp_path: Path, column: str
) -> None:
    # A speedrun-style metrics.csv: one row a step, its loss blank but every 25 steps, where a
    # row typed val holds the validation loss (and the time so far), and a typed train row the loss.
    losses = _curve(100, seed=7)
    rows: list[dict[str, object]] = []
    for step, loss in enumerate(losses, 1):
        rows.append({"step": step, column: "train", "loss": round(loss, 4), "time_ms": 10 * step})
        if step % 25 == 0:
            rows.append({"step": step, column: "val", "loss": round(loss + 0.3, 4), "time_ms": 10 * step})
    rows.insert(0, {"step": 0, column: "config", "loss": "", "time_ms": 0})
    s = load(_write(tmp_path / "metrics.csv", ["step", column, "loss", "time_ms"], rows))
    assert s.values("loss") == (list(range(1, 101)), [round(x, 4) for x in losses])
    assert s.values("eval_loss") == (
        [25, 50, 75, 100],
        [round(losses[k - 1] + 0.3, 4) for k in (25, 50, 75, 100)],
    )
    assert s.values("eval_time_ms")[0] == [25, 50, 75, 100] and s.values("time_ms")[0] == list(range(1, 101))


def test_lightning_on_step_on_epoch_keeps_the_epoch_mean_out_of_the_loss(tmp_path: Path) -> None:
    losses = _curve(60, seed=4)
    p = _lightning(tmp_path / "metrics.csv", losses, per_epoch=20, on_epoch=True)
    s = load(p)
    assert s.values("loss") == (list(range(60)), losses)
    assert s.values("train_loss_epoch")[0] == [19, 39, 59]
    assert _spike_steps(p) == [SPIKE_AT]


def test_wandb_history_of_an_hf_run_is_stepped_by_the_trainer_not_by_log_calls(tmp_path: Path) -> None:
    """HF logs every 10 steps and evaluates every 200; each is a W&B log call counted by ``_step``."""
    losses = _curve(60, seed=5)
    rng = random.Random(5)
    header = [
        "_step",
        "_runtime",
        "_timestamp",
        "train/loss",
        "train/grad_norm",
        "train/learning_rate",
        "train/epoch",
        "train/global_step",
        "eval/loss",
    ]
    rows: list[dict[str, object]] = []
    for i, loss in enumerate(losses):
        gstep = 10 * (i + 1)
        common = {"_runtime": 3.0 * len(rows), "_timestamp": 1_700_000_000 + 3 * len(rows)}
        rows.append(
            {
                "_step": len(rows),
                **common,
                "train/loss": loss,
                "train/grad_norm": 1 + 0.1 * rng.random(),
                "train/learning_rate": 3e-4,
                "train/epoch": gstep / 200,
                "train/global_step": gstep,
            }
        )
        if gstep % 200 == 0:
            row = {"_step": len(rows), **common, "train/epoch": gstep / 200, "train/global_step": gstep}
            rows.append({**row, "eval/loss": loss * 1.02})
    p = _write(tmp_path / "history.csv", header, rows)
    s = load(p)
    steps = [10 * (i + 1) for i in range(60)]
    assert s.steps == 60 and "_step" not in s.metrics
    assert s.values("loss") == (steps, losses)
    assert s.values("eval_loss") == ([200, 400, 600], [losses[i] * 1.02 for i in (19, 39, 59)])
    assert _spike_steps(p) == [10 * (SPIKE_AT + 1)]


def test_step_column_prefers_the_trainer_step_and_falls_back_to_wandb_step(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_text("_step,trainer/global_step,loss\n0,5,2.0\n1,5,\n2,10,1.9\n")
    assert [(r.step, r.loss) for r in load(p).records] == [(5, 2.0), (10, 1.9)]
    p.write_text("_step,loss\n0,2.0\n1,1.9\n")
    assert [(r.step, r.loss) for r in load(p).records] == [(0, 2.0), (1, 1.9)]


def test_one_column_each_feeds_loss_and_eval_loss_in_order_of_preference(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_text(
        "step,train/loss,train_loss_step,train/train_loss,val_loss_epoch,eval_loss\n"
        "1,2.0,9.0,,,\n2,1.9,9.0,,3.0,2.1\n3,,,1.95,,\n"
    )
    s = load(p)
    assert s.values("loss") == ([1, 2], [2.0, 1.9])  # train_loss_step is not interleaved into it
    assert s.values("eval_loss") == ([2], [2.1])
    # train/ is dropped (the Trainer's TensorBoard and W&B callbacks put it before every key).
    assert (s.values("train_loss"), s.values("val_loss_epoch")) == (([3], [1.95]), ([2], [3.0]))
    assert "train_loss_step" not in s.metrics
    # A name only the shared aliases know is still taken when no preferred one is there.
    p.write_text("iteration,lm loss,validation loss\n1,2.0,\n2,1.9,2.2\n")
    assert [(r.step, r.loss, r.eval_loss) for r in load(p).records] == [(1, 2.0, None), (2, 1.9, 2.2)]


def test_a_table_written_once_an_epoch_is_stepped_by_its_epochs(tmp_path: Path) -> None:
    """Keras' CSVLogger writes ``epoch,accuracy,loss,val_accuracy,val_loss``, one row an epoch, no step."""
    losses = _curve(80, seed=7)
    rows = [
        {"epoch": e, "accuracy": 0.5 + e / 200, "loss": loss, "val_accuracy": 0.5, "val_loss": loss * 1.05}
        for e, loss in enumerate(losses)
    ]
    p = _write(tmp_path / "training.log.csv", ["epoch", "accuracy", "loss", "val_accuracy", "val_loss"], rows)
    s = load(p)
    assert s.format == "csv" and s.steps == 80 and "epoch" not in s.metrics
    assert s.values("loss") == (list(range(80)), losses)
    assert s.values("eval_loss")[1] == [x * 1.05 for x in losses]
    assert _spike_steps(p) == [SPIKE_AT]


def test_an_epoch_column_beside_a_step_column_stays_a_metric(tmp_path: Path) -> None:
    p = tmp_path / "metrics.csv"
    p.write_text("epoch,step,loss\n0,10,2.0\n0,20,1.9\n1,30,1.8\n")
    s = load(p)
    assert [(r.step, r.epoch, r.loss) for r in s.records] == [(10, 0.0, 2.0), (20, 0.0, 1.9), (30, 1.0, 1.8)]


def test_columns_named_in_words_are_read_and_each_model_of_a_table_is_a_run(tmp_path: Path) -> None:
    """A hand-written table of several models' epochs: ``Train Loss`` is the loss, ``Val Loss`` the
    eval loss, and the epoch going back to 1 starts the next model's run."""
    header = ["Model", "Epoch", "Total Epochs", "Train Loss", "Val Loss", "Time (s)"]
    rows: list[dict[str, object]] = []
    curves = {
        "small": [0.9 + 1.1 * 0.8**e for e in range(12)],
        "large": [0.6 + 1.2 * 0.7**e for e in range(12)],
    }
    for model, losses in curves.items():
        for e, loss in enumerate(losses, 1):
            row = {"Model": model, "Epoch": e, "Total Epochs": 12, "Train Loss": loss, "Val Loss": loss + 0.1}
            rows.append({**row, "Time (s)": 14.5})
    s = load(_write(tmp_path / "training_metrics.csv", header, rows))
    runs = s.runs()
    assert s.format == "csv" and len(runs) == 2
    for run, losses in zip(runs, curves.values(), strict=True):
        assert [(r.step, r.loss) for r in run.records] == list(enumerate(losses, 1))
        assert [r.eval_loss for r in run.records] == [x + 0.1 for x in losses]
    assert {"time_(s)", "total_epochs"} <= set(s.metrics) and "model" not in s.metrics


def test_a_wandb_chart_of_several_runs_is_read_as_each_run_on_its_own(tmp_path: Path) -> None:
    """A chart comparing runs exports one column group per run, ``<run> - train/loss`` with its
    ``__MIN``/``__MAX`` bands, blank past a run's last step: each run is a run, none left out."""
    curves = {"baseline": _curve(80, seed=1), "char-level": _curve(120, seed=2, start=25.0, end=3.7)}
    header = ["Step"]
    for run in curves:
        header += [f"{run} - train/loss", f"{run} - train/loss__MIN", f"{run} - train/loss__MAX"]
    rows: list[dict[str, object]] = []
    for step in range(120):
        row: dict[str, object] = {"Step": step}
        for run, losses in curves.items():
            if step < len(losses):
                row |= {f"{run} - train/loss{band}": losses[step] for band in ("", "__MIN", "__MAX")}
        rows.append(row)
    s = load(_write(tmp_path / "wandb_export.csv", header, rows))
    runs = s.runs()
    assert s.format == "csv" and len(runs) == 2
    for run, losses in zip(runs, curves.values(), strict=True):
        assert [(r.step, r.loss) for r in run.records] == list(enumerate(losses))


def test_a_table_numpy_savetxt_writes_is_read_by_its_commented_header(tmp_path: Path) -> None:
    """``np.savetxt("losses.txt", rows, header="epoch train_loss val_loss")``: blank-separated,
    its header behind a ``#``, every number in ``%.18e``; a text log's step lines stay text."""
    losses = _curve(60, seed=5)
    lines = ["# epoch train_loss val_loss"]
    lines += [f"{e:.18e} {x:.18e} {x * 1.05:.18e}" for e, x in enumerate(losses)]
    p = tmp_path / "losses.txt"
    p.write_text("\n".join(lines) + "\n")
    s = load(p)
    assert s.format == "csv"
    assert s.values("loss") == (list(range(60)), pytest.approx(losses))
    assert s.values("eval_loss")[1] == pytest.approx([x * 1.05 for x in losses])
    assert _spike_steps(p) == [SPIKE_AT]
    text = tmp_path / "train.log"
    text.write_text("step loss\n" + "".join(f"step {k} loss {x:.4f}\n" for k, x in enumerate(losses)))
    assert load(text).format == "text_log"


def test_a_table_of_runs_each_at_its_last_step_is_no_log(tmp_path: Path) -> None:
    """W&B's runs export: one row per run, its config and its summary, every run at its last step."""
    header = ["Name", "State", "learning_rate", "n_layer", "iter", "train/loss", "val/loss"]
    rows = [
        {
            "Name": f"run-{k}",
            "State": "finished",
            "learning_rate": 1e-3 * k,
            "n_layer": 6,
            "iter": 5000,
            "train/loss": 1.0 + k / 10,
            "val/loss": 1.4 + k / 10,
        }
        for k in range(6)
    ]
    with pytest.raises(UnreadableLog, match="all 6 rows are at step 5000"):
        load(_write(tmp_path / "wandb_export.csv", header, rows))
    one = _write(tmp_path / "one.csv", header, rows[:1])  # one row: a run of one logged step
    assert [(r.step, r.loss) for r in load(one).records] == [(5000, 1.0)]


# -- tables printed or pasted: a notebook's training table, a model card's results ------------------


def test_a_notebook_table_after_a_banner_is_read_and_its_spike_found(tmp_path: Path) -> None:
    """What a notebook's training table gives when copied out: a banner, a progress line, then
    ``Step<TAB>Training Loss`` and one row a step."""
    losses = _curve(120, seed=3)
    lines = ["==((====))==  Unsloth - 2x faster free finetuning | Num GPUs = 1", " [120/120, Epoch 0/1]"]
    lines += ["Step\tTraining Loss"] + [f"{i}\t{v:.6f}" for i, v in enumerate(losses, start=1)]
    path = tmp_path / "notebook.txt"
    path.write_text("\n".join(lines) + "\n")
    s = load(path)
    assert s.format == "csv" and [r.step for r in s.records] == list(range(1, 121))
    assert _spike_steps(path) == [SPIKE_AT + 1]


def _model_index(results: int) -> list[str]:
    """A model card's front matter naming ``results`` benchmark results, nine lines each."""
    lines = ["---", "license: apache-2.0", "model-index:", "- name: tiny-sft", "  results:"]
    for k in range(results):
        lines += [
            "  - task:",
            "      type: automatic-speech-recognition",
            "    dataset:",
            f"      name: eval set {k}",
            "      type: some/dataset",
            "    metrics:",
            "    - name: Test WER",
            "      type: wer",
            f"      value: {30 + k}.5",
        ]
    return [*lines, "---"]


def _model_card(eval_losses: list[float], results: int = 0) -> str:
    """A model card as the Trainer writes it: its *Training results* table among other sections."""
    rows = [f"| No log        | 1.0   | 50   | {eval_losses[0]:.4f}          | 0.50     |"]
    for e, v in enumerate(eval_losses[1:], start=2):
        rows.append(f"| {1.2 * math.exp(-e / 3):.4f}    | {e}.0   | {50 * e}  | {v:.4f}      | 0.70     |")
    return "\n".join(
        [
            *(_model_index(results) if results else ["---", "license: apache-2.0", "---"]),
            "# tiny-sft",
            "",
            "## Training results",
            "",
            "| Training Loss | Epoch | Step | Validation Loss | Accuracy |",
            "|:-------------:|:-----:|:----:|:---------------:|:--------:|",
            *rows,
            "",
            "### Framework versions",
            "",
            "- Transformers 4.40.0",
        ]
    )


@pytest.mark.parametrize("results", [0, 12])  # 12 results: the table starts past line 110
def test_a_model_cards_results_table_is_read_and_a_rising_eval_loss_is_overfitting(
    tmp_path: Path, results: int
) -> None:
    rising = tmp_path / "rising.md"
    rising.write_text(_model_card([0.90, 0.70, 0.62, 0.60, 0.66, 0.74, 0.83, 0.93], results))
    s = load(rising)
    assert s.format == "csv" and [r.step for r in s.records] == [50 * e for e in range(1, 9)]
    assert s.records[0].loss is None and s.records[0].eval_loss == pytest.approx(0.90)  # "No log"
    assert "epoch" in s.metrics and "accuracy" in s.metrics
    assert [a.kind for a in replay(s.records).anomalies] == ["overfitting"]
    falling = tmp_path / "falling.md"
    falling.write_text(_model_card([0.90, 0.70, 0.62, 0.58, 0.55, 0.53, 0.52, 0.51], results))
    assert replay(load(falling).records).anomalies == []


@pytest.mark.parametrize("delim", ["|", ","])
def test_a_table_a_text_log_prints_before_its_step_lines_leaves_them_to_the_text_reader(
    tmp_path: Path, delim: str
) -> None:
    """A training script that prints its LR schedule (a table with a step column) before its own
    ``step N | loss X`` lines: read as a table, the run would be its three rows and the spike lost."""
    losses = _curve(120, seed=5)
    schedule = [(0, 0.0), (100, 1e-5), (200, 2e-5)]
    if delim == "|":
        table = ["| Step | Learning Rate |", "|---|---|", *(f"| {s} | {lr} |" for s, lr in schedule)]
    else:
        table = ["step,lr", *(f"{s},{lr}" for s, lr in schedule)]
    steps = [f"step {i}/120 | loss {v:.6f} | lr 2e-05" for i, v in enumerate(losses, start=1)]
    path = tmp_path / "train.log"
    path.write_text("\n".join(["LR schedule:", *table, "", *steps]) + "\n")
    s = load(path)
    assert s.format == "text_log" and [r.step for r in s.records] == list(range(1, 121))
    assert _spike_steps(path) == [SPIKE_AT + 1]


@pytest.mark.parametrize(
    "text",
    [
        "We trained with step, loss and lr logged.\nstep 1, loss 2.3\nstep 2, loss 2.1\n",
        "| Model | Step | Loss |\n|---|---|---|\n| ours | final | 2.1 |\n| base | final | 2.4 |\n",
    ],
)
def test_prose_or_a_table_without_numbered_steps_is_no_table(tmp_path: Path, text: str) -> None:
    path = tmp_path / "notes.md"
    path.write_text(text)
    with pytest.raises(UnreadableLog):
        load(path)


def test_a_quote_never_closed_is_an_unreadable_log_that_says_where_and_why(tmp_path: Path) -> None:
    """The cell runs on through every line after it until the csv module's cell limit (128 KiB)."""
    path = tmp_path / "metrics.csv"
    path.write_text('step,loss\n1,2.5\n2,2.4\n3,"2.3\n' + "".join(f"{s},2.2\n" for s in range(4, 30_000)))
    with pytest.raises(UnreadableLog, match=r"after step 2 .*never closed"):
        load(path)

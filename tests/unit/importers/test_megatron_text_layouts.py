"""Megatron-LM and NeMo 2 console layouts whose loss field says more (or less) than its number.

Every log is generated here in the tools' own format (Megatron's ``training_log`` and
``evaluate_and_print_results``, NeMo 2's ``ProgressPrinter``), on a falling loss curve.
"""

from __future__ import annotations

import math
from pathlib import Path

from steadytune.detect.offline import detect
from steadytune.importers import detect_format, load


def _curve(it: int) -> float:
    return 2.2 + 8.7 * math.exp(-it / 12)


def _iteration(
    it: int,
    loss: float | None,
    grad: float | None,
    skipped: int = 0,
    nan: int = 0,
    scale: float = 1.0,
    prefix: str = "",
) -> str:
    """One line as Megatron's training_log prints it (a None loss or grad norm is left out, as there)."""
    parts = [
        f"consumed samples: {it * 256:12d}",
        "elapsed time per iteration (ms): 1234.5",
        "throughput per GPU (TFLOP/s/GPU): 412.3",
        f"learning rate: {3e-4 * (1 - it / 500):.6E}",
        "global batch size:   256",
    ]
    if loss is not None:
        parts.append(f"lm loss: {loss:.6E}")
    parts.append(f"loss scale: {scale:.1f}")
    if grad is not None:
        parts.append(f"grad norm: {grad:.3f}")
    parts += [f"number of skipped iterations: {skipped:3d}", f"number of nan iterations: {nan:3d}"]
    head = f"{prefix} [2024-05-01 12:{it // 60:02d}:{it % 60:02d}.000000] iteration {it:8d}/{500:8d} |"
    return head + "".join(f" {p} |" for p in parts)


def _validation(where: str, loss: float, name: str = "") -> str:
    fields = f"lm loss value: {loss:.6E} | lm loss PPL: {math.exp(loss):.6E} | "
    return f" validation{name} loss at {where} | {fields}"


def _write(tmp_path: Path, lines: list[str], name: str = "train.log") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def _kinds(path: Path) -> set[str]:
    return {a.kind for a in detect(load(path).records)}


def test_a_nan_loss_megatron_leaves_out_is_read_as_nan(tmp_path: Path) -> None:
    """bf16: the NaN average fails Megatron's ``avg >= 0``, so the field is missing; nothing is skipped
    (no loss scaler) and the gradient norm is NaN."""
    lines = [_iteration(it, _curve(it), 1.0 + 3 * math.exp(-it / 10)) for it in range(1, 31)]
    lines += [_iteration(it, None, math.nan) for it in range(31, 41)]
    p = _write(tmp_path, lines)
    s = load(p)
    assert s.steps == 40 and s.records[29].loss == float(f"{_curve(30):.6E}")
    assert all(r.loss is not None and math.isnan(r.loss) for r in s.records[30:])
    assert "nan_loss" in _kinds(p)


def test_nan_iterations_without_a_loss_field_are_a_nan_loss(tmp_path: Path) -> None:
    """fp16: the non-finite losses were skipped and counted as nan iterations; no average was printed."""
    lines = [_iteration(it, _curve(it), 1.5, scale=4096.0) for it in range(5, 155, 5)]
    lines += [
        _iteration(it, None, None, skipped=5, nan=5, scale=4096.0 / 2**k)
        for k, it in enumerate(range(155, 205, 5))
    ]
    p = _write(tmp_path, lines)
    s = load(p)
    tail = s.records[-10:]
    assert all(r.loss is not None and math.isnan(r.loss) and r.skipped for r in tail)
    assert "nan_loss" in _kinds(p)


def test_the_zero_of_an_all_skipped_interval_is_not_a_loss(tmp_path: Path) -> None:
    """fp16 overflow: every iteration of the interval skipped, the reset total of 0 is printed as the loss."""
    lines = []
    for it in range(5, 205, 5):
        if it in (100, 105, 110):
            lines.append(_iteration(it, 0.0, None, skipped=5, scale=65536.0 / 2 ** (it // 5 - 19)))
        elif it == 115:  # two of five skipped: the average of the other three is a real loss
            lines.append(_iteration(it, _curve(it), 1.2, skipped=2, scale=8192.0))
        else:
            lines.append(_iteration(it, _curve(it), 1.0 + 3 * math.exp(-it / 40), scale=8192.0))
    p = _write(tmp_path, lines)
    by_step = {r.step: r for r in load(p).records}
    assert [(by_step[i].loss, by_step[i].skipped) for i in (100, 105, 110)] == [(None, True)] * 3
    assert by_step[115].loss == float(f"{_curve(115):.6E}") and by_step[115].skipped
    assert "loss_collapse" not in _kinds(p)


def test_an_all_skipped_interval_with_nan_iterations_is_a_nan_loss(tmp_path: Path) -> None:
    lines = [_iteration(it, _curve(it), 1.5, scale=8192.0) for it in range(1, 41)]
    lines += [
        _iteration(it, 0.0, None, skipped=1, nan=1, scale=8192.0 / 2**k) for k, it in enumerate(range(41, 51))
    ]
    p = _write(tmp_path, lines)
    assert all(r.loss is not None and math.isnan(r.loss) for r in load(p).records[40:])
    kinds = _kinds(p)
    assert "nan_loss" in kinds and "loss_collapse" not in kinds


def test_validation_lines_are_the_eval_loss_of_their_iteration(tmp_path: Path) -> None:
    lines = []
    for it in range(1, 61):
        lines.append("[rank7]:" + _iteration(it, _curve(it), 1.1))
        if it == 20:
            lines.append("[rank7]:" + _validation(f"iteration {it} on validation set", _curve(it) + 0.05))
        elif it == 40:  # older Megatron: the prefix is the iteration alone
            lines += ["-" * 100, _validation(f"iteration {it}", _curve(it) + 0.06), "-" * 100]
        elif it == 50:  # a named set and the test set are not the validation loss
            lines.append(_validation(f"iteration {it} on validation set", 2.9, name="-wiki"))
            lines.append(_validation(f"iteration {it} on test set", 2.8))
    lines.append(_validation("the end of training for val data", 2.5))
    lines.append(_validation("the end of training for test data", 2.4))
    s = load(_write(tmp_path, lines))
    assert s.format == "megatron_text" and "eval_loss" in s.metrics
    evals = [(r.step, r.eval_loss) for r in s.records if r.eval_loss is not None]
    assert evals == [
        (20, float(f"{_curve(20) + 0.05:.6E}")),
        (40, float(f"{_curve(40) + 0.06:.6E}")),
        (60, 2.5),
    ]
    assert s.records[49].extra["validation-wiki lm loss"] == 2.9
    assert s.records[59].loss == float(f"{_curve(60):.6E}")


def _nemo(step: int, epoch_len: int, loss: float, val: float | None) -> str:
    """One line of NeMo 2's ProgressPrinter (values formatted as its ``format_string`` does)."""
    metrics: dict[str, float] = {
        "lr": 3e-4 * (1 - step / 200),
        "global_batch_size": 32.0,
        "global_step": float(step),
        "reduced_train_loss": loss,
        "train_step_timing in s": 0.4567,
        "consumed_samples": float((step + 1) * 32),
    }
    if val is not None:
        metrics["val_loss"] = val
    text = f"Training epoch {step // epoch_len}, iteration {step % epoch_len}/{epoch_len - 1}"
    for key, v in metrics.items():
        text += f" | {key}: {int(v)}" if v.is_integer() else f" | {key}: {v:.4}"
    return text


def test_nemo2_progress_printer_lines(tmp_path: Path) -> None:
    """The loss is ``reduced_train_loss``; ``val_loss`` stays on every line after a validation; the
    iteration restarts each epoch while the global step runs on."""
    lines: list[str] = []
    val: float | None = None
    for step in range(60):
        lines.append(_nemo(step, 30, _curve(step), val))
        if step in (19, 39):
            lines += ["Validation: iteration 1/2", "Validation: iteration 2/2"]
            val = _curve(step) + 0.1
    lines.append("`Trainer.fit` stopped: `max_steps=60` reached.")
    p = _write(tmp_path, lines)
    assert detect_format(p) == "megatron_text"
    s = load(p)
    assert s.steps == 60 and [r.step for r in s.records] == list(range(60))
    assert [r.loss for r in s.records] == [float(f"{_curve(i):.4}") for i in range(60)]
    assert [(r.step, r.eval_loss) for r in s.records if r.eval_loss is not None] == [
        (19, float(f"{_curve(19) + 0.1:.4}")),
        (39, float(f"{_curve(39) + 0.1:.4}")),
    ]
    first, last = s.records[0], s.records[-1]
    assert (first.lr, first.samples, first.step_time_s) == (3e-4, 32, 0.4567)
    assert last.extra["consumed_samples"] == 1920.0
    assert s.records[19].extra["consumed_samples"] == 640.0  # not run into the "Validation:" line

"""The text and JSON-lines layouts training scripts print, each written by a seeded loop in the test."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest

from steadytune.detect import detect
from steadytune.importers import UnreadableLog, detect_format, load
from steadytune.importers.prefix import strip_prefix


def _curve(n: int, seed: int = 0, start: float = 10.9, end: float = 3.3) -> list[float]:
    """A plausible loss curve: exponential decay with 1% noise."""
    rng = random.Random(seed)
    return [end + (start - end) * math.exp(-i / (n / 5)) * (1 + 0.01 * rng.gauss(0, 1)) for i in range(n)]


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def _series(path: Path, metric: str) -> list[tuple[int, float]]:
    return list(zip(*load(path).values(metric), strict=True))


# --- llm.c ---------------------------------------------------------------------------------------


def test_llmc_main_log_reads_train_val_lr_norm_and_hellaswag(tmp_path: Path) -> None:
    losses = _curve(60, seed=1)
    lines = []
    for s, loss in enumerate(losses):
        if s % 20 == 0:
            lines.append(f"s:{s} tel:{loss + 0.05:.4f}")
        if s == 40:
            lines.append(f"s:{s} eval:0.2611")
        lines.append(
            f"s:{s} trl:{loss:.4f} lr:{6e-4 * min(1, (s + 1) / 10):.6f} norm:{1 + 0.1 * (s % 3):.2f}"
        )
    p = _write(tmp_path, "main.log", lines)
    s = load(p)
    assert s.format == "llmc_log" and s.steps == 60
    assert [x for x, _ in _series(p, "eval_loss")] == [0, 20, 40]
    by_step = {r.step: r for r in s.records}
    assert by_step[3].loss == round(losses[3], 4) and by_step[3].grad_norm == 1.0 and by_step[9].lr == 6e-4
    assert by_step[40].extra["hellaswag"] == 0.2611


def _llmc_stdout(losses: list[float], val_every: int, zscores: bool = False) -> list[str]:
    n = len(losses)
    lines = ["+-----------------------+", "| Parameter | Value |", "allocated 474 MiB for model parameters"]
    for step, loss in enumerate(losses):
        if step % val_every == 0:
            lines.append(f"val loss {loss + 0.1:f}")
        if zscores:
            body = f"loss {loss:7.6f} (+0.01z)| norm {0.9:6.4f} (-0.20z)| lr {1e-4:.2e}"
        else:
            body = f"train loss {loss:7.6f} | norm {0.9 + step / 100:6.4f} | lr {1e-6 * (step + 1):.2e}"
        lines.append(
            f"step {step + 1:4d}/{n} | {body} | {417.0 + step:.2f} ms | -100.0% bf16 MFU | 19644 tok/s"
        )
    lines.append(f"val loss {losses[-1]:f}")
    return lines


def test_llmc_stdout_numbers_from_one_and_puts_val_loss_after_the_steps_done(tmp_path: Path) -> None:
    losses = _curve(30, seed=2)
    p = _write(tmp_path, "train.out", _llmc_stdout(losses, val_every=10))
    s = load(p)
    assert s.format == "llmc_stdout" and s.steps == 31  # steps 1..30 and the val at 0
    first = next(r for r in s.records if r.step == 1)
    assert (first.loss, first.grad_norm, first.lr) == (round(losses[0], 6), 0.9, 1e-6)
    assert first.step_time_s == pytest.approx(0.417) and first.extra["tokens_per_s"] == 19644
    assert "mfu_percent" not in first.extra  # -100% means unknown
    assert [x for x, _ in _series(p, "eval_loss")] == [0, 10, 20, 30]


def test_llmc_stdout_with_z_scores(tmp_path: Path) -> None:
    p = _write(tmp_path, "train.out", _llmc_stdout(_curve(12, seed=3), val_every=100, zscores=True))
    s = load(p)
    assert s.format == "llmc_stdout" and [r.grad_norm for r in s.records if r.loss is not None][:2] == [
        0.9,
        0.9,
    ]


def test_llmc_cpu_stdout_evaluates_before_the_step_it_prints(tmp_path: Path) -> None:
    lines = []
    for step, loss in enumerate(_curve(25, seed=4)):
        if step % 10 == 0:
            lines.append(f"val loss {loss + 0.2:f}")
        lines.append(f"step {step}: train loss {loss:f} (took {1500.0 + step:f} ms)")
    p = _write(tmp_path, "cpu.out", lines)
    assert detect_format(p) == "llmc_stdout"
    assert [x for x, _ in _series(p, "eval_loss")] == [0, 10, 20]
    assert load(p).records[0].step_time_s == pytest.approx(1.5)


# --- build-nanoGPT -------------------------------------------------------------------------------


def test_build_nanogpt_log_txt(tmp_path: Path) -> None:
    lines = []
    for step, loss in enumerate(_curve(50, seed=5)):
        if step % 25 == 0:
            lines += [f"{step} val {loss + 0.02:.4f}", f"{step} hella {0.25 + step / 1000:.4f}"]
        lines.append(f"{step} train {loss:.6f}")
    p = _write(tmp_path, "log.txt", lines)
    s = load(p)
    assert s.format == "nanogpt_log" and s.steps == 50
    assert [x for x, _ in _series(p, "eval_loss")] == [0, 25]
    assert s.records[25].extra["hellaswag"] == 0.275 and s.records[1].loss is not None


def test_build_nanogpt_stdout(tmp_path: Path) -> None:
    lines = ["using device: cuda", "total desired batch size: 524288"]
    for step, loss in enumerate(_curve(40, seed=6)):
        if step % 20 == 0:
            lines += [f"validation loss: {loss + 0.03:.4f}", "HellaSwag accuracy: 2510/10042=0.2499"]
            lines.append("rank 0 sample 0: Hello, I'm a language model, and")
        lines.append(
            f"step {step:5d} | loss: {loss:.6f} | lr {6e-4:.4e} | norm: {0.45:.4f} | dt: {330.12:.2f}ms"
            f" | tok/sec: {1588123.45:.2f}"
        )
    p = _write(tmp_path, "stdout.txt", lines)
    s = load(p)
    assert s.format == "nanogpt_stdout" and s.steps == 40
    r = s.records[5]
    assert (r.lr, r.grad_norm, r.step_time_s, r.extra["tokens_per_s"]) == (6e-4, 0.45, 0.33012, 1588123.45)
    assert [x for x, _ in _series(p, "eval_loss")] == [0, 20]
    assert s.records[20].extra["hellaswag"] == 0.2499


# --- modded-nanogpt (the speedrun) -------------------------------------------------------------


def _speedrun(
    n: int, seed: int, every: int = 25, train_loss: bool = False, code_lines: int = 2500
) -> tuple[list[str], list[float], list[float]]:
    """A speedrun log as its script prints it: its own source first, then ``step:N/M`` lines whose
    ``train_time`` sums generated step times (the clock stops while it evaluates). Returns the lines,
    the step times (ms, index = step - 1) and the losses."""
    rng = random.Random(seed)
    times = [rng.uniform(20.0, 400.0) * (3.0 if i == 0 else 1.0) for i in range(n)]  # a compiling first step
    losses = _curve(n + 1, seed=seed)
    code = ["import os", "import torch", "def main():"]
    code += [
        f"    x_{i} = torch.zeros({i})  # line {i} of the script, logged before the run"
        for i in range(code_lines)
    ]
    code.append('    print0(f"step:{step}/{train_steps} val_loss:{val_loss:.4f} train_time:{t:.0f}ms")')
    lines, clock = [*code, "=" * 100], 0.0
    for step in range(n + 1):
        if step:
            clock += times[step - 1]
            loss = f" train_loss:{losses[step]:.4f}" if train_loss else ""
            extra = f" tokens_seen:{step * 524288:.2e} tokens/sec:{524288 / times[step - 1] * 1000:.2e}"
            lines.append(
                f"step:{step}/{n}{loss} train_time:{clock:.0f}ms step_avg:{clock / step:.2f}ms"
                + (extra if train_loss else "")
            )
        if step % every == 0 or step == n:
            late = clock + rng.uniform(0.0, 90.0)  # the timer stops a little after the step's line
            lines.append(
                f"step:{step}/{n} val_loss:{losses[step] + 0.05:.4f} train_time:{late:.0f}ms step_avg:0.1ms"
            )
    lines.append("peak memory allocated: 29709 MiB reserved: 44538 MiB")
    return lines, times, losses


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("train_loss", [False, True])
def test_modded_nanogpt_step_times_are_the_training_clock_between_step_lines(
    tmp_path: Path, seed: int, train_loss: bool
) -> None:
    n = 120
    lines, times, losses = _speedrun(n, seed, train_loss=train_loss)
    p = _write(tmp_path, "speedrun.txt", lines)
    assert detect_format(p) == "modded_nanogpt"  # its head is its source code: the tail tells
    s = load(p)
    assert s.steps == n + 1 and [r.step for r in s.records] == list(range(n + 1))
    got = {r.step: r.step_time_s for r in s.records}
    # The clock is printed in whole ms: each step's time is the difference of two rounded sums.
    for step in range(2, n + 1):
        assert got[step] == pytest.approx(times[step - 1] / 1000.0, abs=1.01e-3), step
    assert got[0] is None and got[1] is None  # the first step line has no line before it to count from
    assert [x for x, _ in _series(p, "eval_loss")] == [*range(0, n, 25), n]
    assert all("step_avg" not in r.extra and "train_time" not in r.extra for r in s.records)
    if train_loss:
        assert [r.loss for r in s.records[1:]] == pytest.approx([round(x, 4) for x in losses[1:]])
        r = s.records[7]
        assert r.extra["tokens_per_s"] == pytest.approx(524288 / times[6] * 1000, rel=1e-2)
    else:
        assert all(r.loss is None for r in s.records)


def test_modded_nanogpt_a_restarted_run_counts_no_step_time_across_the_restart(tmp_path: Path) -> None:
    first, _, _ = _speedrun(30, seed=3, code_lines=5)
    again, times, _ = _speedrun(30, seed=4, code_lines=5)
    p = _write(tmp_path, "speedrun.txt", [*first, *again])
    s = load(p)
    assert s.format == "modded_nanogpt"
    step_times = [r.step_time_s for r in s.records if r.step_time_s is not None]
    assert all(t > 0 for t in step_times)
    last = [r for r in s.records if r.step == 30][-1]
    assert last.step_time_s == pytest.approx(times[-1] / 1000.0, abs=1.01e-3)


@pytest.mark.parametrize("damaged", ["nan", "inf", "-inf"])
def test_modded_nanogpt_a_clock_that_is_no_number_counts_no_step_time(tmp_path: Path, damaged: str) -> None:
    lines, times, _ = _speedrun(30, seed=5, code_lines=5)
    at = next(i for i, line in enumerate(lines) if line.startswith("step:10/30 train_time:"))
    lines[at] = re.sub(r"train_time:\S+", f"train_time:{damaged}ms", lines[at])
    s = load(_write(tmp_path, "speedrun.txt", lines))
    got = {r.step: r.step_time_s for r in s.records}
    assert all(t is None or math.isfinite(t) for t in got.values())
    assert got[10] is None  # and step 11 is timed from step 9, over the two steps
    assert got[11] == pytest.approx((times[9] + times[10]) / 2 / 1000.0, abs=1.01e-3)


# --- the generic text layout ---------------------------------------------------------------------

GENERIC = {
    "pipes": "step {s} | loss {loss:.4f} | grad_norm {g:.3f} | lr {lr:.2e}",
    "step_of_total": "Step {s}/1000 - train_loss: {loss:.4f} - grad norm: {g:.3f} - learning_rate: {lr:g}",
    "equals": "iteration={s} loss={loss:.5f} gnorm={g:.3f} lr={lr:.3e} loss_scale=65536",
    "nanogpt_iter": "iter {s}: loss {loss:.4f}, time {t:.2f}ms, mfu 31.20%",
    "step_colon": "Step: {s}, Loss: {loss:.4f}, Grad Norm: {g:.4f}, LR: {lr:.6f}",
    "bracket": "[{s}/1000] train loss: {loss:.4f} norm: {g:.3f}",
    "tensor": "global_step {s} loss tensor({loss:.4f}, device='cuda:0') lr [{lr:g}]",
}


@pytest.mark.parametrize("layout", sorted(GENERIC))
def test_generic_text_layouts(tmp_path: Path, layout: str) -> None:
    losses = _curve(30, seed=7)
    lines = ["Loading checkpoint shards: 100%|##########| 2/2", "trainable params: 4,194,304"]
    for i, loss in enumerate(losses):
        lines.append(GENERIC[layout].format(s=10 * (i + 1), loss=loss, g=1.0 + i / 100, lr=2e-5, t=120.5))
        if i == 10:
            lines.append("warning: some tokens were truncated")
    p = _write(tmp_path, "train.log", lines)
    s = load(p)
    assert s.format == "text_log" and s.steps == 30
    got = _series(p, "loss")
    assert [x for x, _ in got] == [10 * (i + 1) for i in range(30)]
    assert all(abs(y - loss) < 1e-3 for (_, y), loss in zip(got, losses, strict=True))
    if "{g" in GENERIC[layout]:
        assert s.records[0].grad_norm == 1.0
    if "{lr" in GENERIC[layout]:
        assert s.records[0].lr == 2e-5
    if "{t" in GENERIC[layout]:
        assert s.records[0].step_time_s == pytest.approx(0.1205)
    # Another key is kept under its own name, never taken for the loss (fp16's loss_scale).
    assert all(r.loss != 65536 for r in s.records)
    assert "loss_scale" not in s.metrics or s.records[0].extra["loss_scale"] == 65536


def test_generic_text_reads_eval_lines_and_karpathy_nanogpt_evals(tmp_path: Path) -> None:
    lines = []
    for i, loss in enumerate(_curve(40, seed=8)):
        if i % 10 == 0:
            lines.append(f"step {i}: train loss {loss:.4f}, val loss {loss + 0.1:.4f}")
        lines.append(f"iter {i}: loss {loss:.4f}, time 101.00ms, mfu 12.00%")
    p = _write(tmp_path, "nanogpt.log", lines)
    assert detect_format(p) == "text_log"
    assert [x for x, _ in _series(p, "eval_loss")] == [0, 10, 20, 30]


def test_generic_text_makes_per_epoch_batch_counters_global(tmp_path: Path) -> None:
    lines = []
    losses = _curve(30, seed=9)
    for epoch in (1, 2, 3):
        for b in range(1, 11):
            loss = losses[(epoch - 1) * 10 + b - 1]
            lines.append(f"Epoch [{epoch}/3], Step [{b * 50}/500], Loss: {loss:.4f}")
    p = _write(tmp_path, "tutorial.log", lines)
    steps = [r.step for r in load(p).records]
    assert steps == sorted(steps) and len(steps) == 30 and steps[10] == 500 + 50


def test_generic_text_keeps_nan_and_ignores_unrelated_lines(tmp_path: Path) -> None:
    lines = [f"step {s} loss {2.0 - s / 100:.3f}" for s in range(1, 6)] + [
        "step 6 loss nan",
        "done. best loss 1.9",
    ]
    s = load(_write(tmp_path, "t.log", lines))
    assert s.steps == 6 and math.isnan(s.records[-1].loss or 0.0)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "We trained for a while. The loss went down at every step.\n"
            "At step 100 the loss was about 2.5, at step 200 it was 2.1.\n"
            "A step size of 3 and a loss weight of 0.5 worked best.\n",
            "no line with a step",
        ),
        ("step 1 loss 2.0\nsome words\nstep 2 loss 1.9\n", "only 2 line(s)"),
        ("step 30 loss 2.0\nstep 20 loss 1.9\nstep 10 loss 1.8\nstep 5 loss 1.7\n", "do not increase"),
    ],
)
def test_text_that_is_not_a_log_says_what_was_looked_for(tmp_path: Path, text: str, reason: str) -> None:
    p = tmp_path / "notes.txt"
    p.write_text(text)
    with pytest.raises(UnreadableLog) as e:
        load(p)
    msg = str(e.value)
    assert reason in msg and "formats tried: composer_console, megatron_text" in msg and "dict_log" in msg
    assert "\n" not in msg


def test_a_long_preamble_before_the_log_lines(tmp_path: Path) -> None:
    code = [f"    x_{i} = compute_something(x_{i - 1})  # a dumped source line" for i in range(1500)]
    lines = code + [f"step:{s}/100 train_loss:{4 - s / 50:.4f} train_time:{s * 10}ms" for s in range(1, 101)]
    p = _write(tmp_path, "modded.txt", lines)
    assert p.stat().st_size > 64 << 10
    s = load(p)
    assert s.format == "modded_nanogpt" and s.steps == 100
    assert s.records[-1].step_time_s == pytest.approx(0.01)


# --- launcher and logger prefixes ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "rank", "rest"),
    [
        ("[rank0]: step 10 | loss 2.3", 0, "step 10 | loss 2.3"),
        ("[default3]:step 10 loss 2.3", 3, "step 10 loss 2.3"),
        ("1: iteration 10/ 100 | lm loss: 2.3 |", 1, "iteration 10/ 100 | lm loss: 2.3 |"),
        ("rank2: step 10 loss 2.3", 2, "step 10 loss 2.3"),
        ("[1,5]<stdout>: step 10 loss 2.3", 5, "step 10 loss 2.3"),
        ("2024-05-01 12:00:00,123 - INFO - step 10 loss 2.3", None, "step 10 loss 2.3"),
        ("[2024-05-01 12:00:00] step 10 loss 2.3", None, "step 10 loss 2.3"),
        ("05/01/2024 12:00:00 - INFO - __main__ - step 10 loss 2.3", None, "step 10 loss 2.3"),
        ("INFO:root:step 10 loss 2.3", None, "step 10 loss 2.3"),
        ("[rank1]:[2024-05-01T12:00:00.5Z] [INFO] s:10 trl:2.3", 1, "s:10 trl:2.3"),
        ("[2024-05-01 12:00:00,1] [INFO] [logging.py:96:log_dist] [Rank 0] step=10", 0, "step=10"),
        ("2025-01-02 03:04:05.678\tnode-a:2\tolmo.train:990\tINFO\t[step=10/100]", 2, "[step=10/100]"),
        ("2025-01-02 03:04:05.678\tolmo.util:12\tWARNING\tstep 10 loss 2.3", None, "step 10 loss 2.3"),
        (
            "2024-10-10 22:34:03.484 | INFO     | __main__:fit:101 - Ep 1 (Step 000005): Train loss 8.9",
            None,
            "Ep 1 (Step 000005): Train loss 8.9",
        ),
        ("2024-10-10 22:34:03 | WARNING | src.train:<module>:7 - step 10 loss 2.3", None, "step 10 loss 2.3"),
        (
            "step:12 - actor/pg_loss:0.009 - actor/grad_norm:3.7",
            None,
            "step:12 - actor/pg_loss:0.009 - actor/grad_norm:3.7",
        ),
        ("s:10 trl:2.3", None, "s:10 trl:2.3"),
        ("10 train 2.3", None, "10 train 2.3"),
        ("information about step 10", None, "information about step 10"),
    ],
)
def test_strip_prefix(line: str, rank: int | None, rest: str) -> None:
    assert strip_prefix(line) == (rank, rest)


def test_torchrun_ranks_keep_the_lowest_rank_whatever_the_order(tmp_path: Path) -> None:
    lines = []
    for s, loss in enumerate(_curve(20, seed=10), start=1):
        for rank in (2, 0, 1) if s % 2 else (1, 2, 0):
            lines.append(f"[rank{rank}]: step {s} | loss {loss + rank:.4f} | lr 1e-4")
    p = _write(tmp_path, "torchrun.log", lines)
    s = load(p)
    assert s.format == "text_log" and len(s.records) == 20
    assert all(abs(y - x) < 1e-3 for (_, y), x in zip(_series(p, "loss"), _curve(20, seed=10), strict=True))


@pytest.mark.parametrize(
    "prefix",
    [
        "0: ",
        "rank0: ",
        "[default0]:",
        "2024-05-01 12:00:00,123 - INFO - ",
        "[2024-05-01 12:00:00] ",
        "2024-05-01 12:00:00.123 | INFO     | __main__:train:101 - ",  # loguru
    ],
)
def test_prefixed_lines_of_every_layout(tmp_path: Path, prefix: str) -> None:
    losses = _curve(12, seed=11)
    layouts = {
        "text_log": [f"step {s} | loss {x:.4f}" for s, x in enumerate(losses)],
        "llmc_stdout": [
            f"step {s + 1:4d}/12 | train loss {x:.6f} | norm 1.0 | lr 1e-4 | 400 ms"
            for s, x in enumerate(losses)
        ],
        "nanogpt_stdout": [
            f"step {s:5d} | loss: {x:.6f} | lr 1e-4 | norm: 1.0 | dt: 300.00ms" for s, x in enumerate(losses)
        ],
        "nanogpt_log": [f"{s} train {x:.6f}" for s, x in enumerate(losses)],
        "llmc_log": [f"s:{s} trl:{x:.4f} lr:0.000100 norm:1.00" for s, x in enumerate(losses)],
        "megatron_text": [
            f" iteration {s:8d}/ 100 | lm loss: {x:E} | grad norm: 1.0 |" for s, x in enumerate(losses)
        ],
    }
    for fmt, lines in layouts.items():
        p = _write(tmp_path, f"{fmt}.log", [prefix + line for line in lines])
        s = load(p)
        assert (s.format, s.steps) == (fmt, 12), fmt
        assert abs(s.records[-1].loss - losses[-1]) < 1e-3, fmt  # type: ignore[operator]


def test_megatron_lines_from_two_ranks(tmp_path: Path) -> None:
    lines = [
        f"[default{rank}]: iteration {s:8d}/ 100 | lm loss: {3.0 - s / 100 + rank - 3:E} | grad norm: 1.0 |"
        for s in range(1, 11)
        for rank in (7, 3)
    ]
    s = load(_write(tmp_path, "megatron.log", lines))
    assert s.format == "megatron_text" and all(r.loss is not None and r.loss < 3.0 for r in s.records)


def test_megatron_like_line_without_colon_fields_is_a_generic_text_log(tmp_path: Path) -> None:
    p = _write(tmp_path, "t.log", [f"iteration {s}/100 | loss {2 - s / 10:.2f}" for s in range(1, 6)])
    assert detect_format(p) == "text_log" and load(p).steps == 5


# --- JSON lines ----------------------------------------------------------------------------------


def test_typed_jsonl_mixes_config_train_and_eval(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [{"type": "config", "model": "gpt2", "lr": 3e-4, "max_steps": 60}]
    for s, loss in enumerate(_curve(60, seed=12), start=1):
        rows.append({"type": "train", "step": s, "loss": round(loss, 4), "grad_norm": 1.1, "lr": 1e-4})
        if s % 20 == 0:
            rows.append({"type": "eval", "step": s, "loss": round(loss + 0.1, 4), "accuracy": 0.5})
        if s == 30:
            rows.append({"_type": "validation", "step": s, "eval_loss": 9.9})
    rows.append({"event": "summary", "step": 60, "loss": 1.0})
    p = _write(
        tmp_path, "metrics.jsonl", [json.dumps(r) for r in rows] + ['{"type": "train", "step": 61, "lo']
    )
    s = load(p)
    assert s.format == "jsonl_log" and s.steps == 60
    assert [x for x, _ in _series(p, "eval_loss")] == [20, 30, 40, 60]
    last = s.records[-1]
    assert last.loss == round(_curve(60, seed=12)[-1], 4) and last.extra["eval_accuracy"] == 0.5
    assert "max_steps" not in s.metrics


def test_plain_jsonl_wandb_like_and_nested(tmp_path: Path) -> None:
    rows = [
        {
            "_step": s,
            "_runtime": 1.5 * s,
            "train/loss": round(x, 4),
            "train/learning_rate": 2e-5,
            "train/epoch": s / 50,
        }
        for s, x in enumerate(_curve(20, seed=13), start=1)
    ]
    p = _write(tmp_path, "wandb.jsonl", [json.dumps(r) for r in rows])
    s = load(p)
    assert s.format == "jsonl_log" and s.records[0].lr == 2e-5 and s.records[0].epoch == 0.02
    nested = [
        {"iter": s, "metrics": {"loss": 2.0 - s / 100, "grad_norm": 0.5}, "rank": r}
        for s in range(5)
        for r in (1, 0)
    ]
    p = _write(tmp_path, "nested.jsonl", [json.dumps(r) for r in nested])
    s = load(p)
    assert [(r.step, r.loss, r.grad_norm) for r in s.records][:2] == [(0, 2.0, 0.5), (1, 1.99, 0.5)]
    assert len(s.records) == 5


def test_jsonl_without_a_step_and_loss_says_so(tmp_path: Path) -> None:
    p = _write(
        tmp_path, "events.jsonl", [json.dumps({"type": "config", "lr": 1e-4}), json.dumps({"msg": "hi"})]
    )
    with pytest.raises(UnreadableLog, match=r"JSON lines, but no object with a loss .* or an RL.preference"):
        load(p)


def test_lines_read_by_template_match_the_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    from steadytune.importers import text_log

    rng = random.Random(14)
    lines = []
    for s in range(200):
        x = rng.choice([f"{rng.random():.4f}", f"{rng.random():.2e}", str(rng.randint(0, 9)), "-1.5", "nan"])
        step = rng.choice([str(s), f"{s}.5", f"{s}."])
        lines += [
            f"step {step} | loss {x} | grad_norm {x} | time {x}ms",
            f"Epoch [1/3], Step [{step}/500], Loss: {x}",
            f"iter {step}: loss {x}, lr {x}",
        ]
    monkeypatch.setattr(text_log, "_LAYOUTS", {})
    cached = [text_log.parse_line(line) for line in lines]
    assert text_log._LAYOUTS  # templates were learnt
    by_rules = []
    for line in lines:
        text_log._LAYOUTS.clear()
        by_rules.append(text_log.parse_line(line))
    assert [repr(c) for c in cached] == [repr(r) for r in by_rules]  # repr: nan == nan


# --- a step's metrics on lines of their own --------------------------------------------------------


def _olmo_block(
    step: int, total: int, loss: float, norm: float, tokens: int, peak_mb: int | None = None
) -> list[str]:
    """OLMo's console: a logger line naming the step, then one indented ``key=value`` a metric,
    counts printed with thousands separators."""
    return [
        f"2025-01-02 03:04:{step % 60:02d}.000\tnode-a:0\tolmo.train:990\tINFO\t"
        f"[step={step}/{total},epoch=0]",
        f"    optim/total_grad_norm={norm:.4f}",
        f"    train/CrossEntropyLoss={loss:.4f}",
        f"    train/Perplexity={math.exp(loss):,.0f}",
        f"    throughput/total_tokens={tokens * step:,}",
        f"    throughput/device/tokens_per_second={tokens:,}",
        f"    System/Peak GPU Memory (MB)={38000 + step if peak_mb is None else peak_mb:,}",
    ]


def test_a_block_of_metric_lines_under_its_step_line_is_one_record(tmp_path: Path) -> None:
    losses = _curve(30, seed=21)
    lines = ["2025-01-02 03:04:00.000\tnode-a:0\ttrain:98\tINFO\tTrainConfig(run_name='x', seed=1)"]
    for i, loss in enumerate(losses):
        lines += _olmo_block(10 * (i + 1), 300, loss, 1.0 + i / 100, 105_000 + i)
        if i == 14:
            lines += ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>']
    p = _write(tmp_path, "train.log", lines)
    s = load(p)
    assert s.format == "text_log" and s.steps == 30
    assert s.values("loss") == ([10 * (i + 1) for i in range(30)], [round(x, 4) for x in losses])
    r = s.records[20]
    assert (r.step, r.grad_norm, r.epoch) == (210, 1.2, 0.0)
    assert r.extra["throughput/device/tokens_per_second"] == 105_020
    assert r.extra["throughput/total_tokens"] == 210 * 105_020
    # OLMo's MB are torch's max_memory_allocated / 10^6: the peak the memory rules judge, in bytes.
    assert r.mem_peak_bytes == (38000 + 210) * 1_000_000
    assert not any("memory" in k or k.startswith("system") for k in r.extra)


@pytest.mark.parametrize("unit, scale", [("MB", 10**6), ("MiB", 1 << 20), ("GB", 10**9), ("GiB", 1 << 30)])
def test_a_peak_memory_with_its_unit_in_the_key_is_read_in_bytes(
    tmp_path: Path, unit: str, scale: int
) -> None:
    lines = [
        f"step {s} | loss {x:.4f} | peak gpu memory ({unit}): {1000 + s:,}" for s, x in enumerate(_curve(8))
    ]
    s = load(_write(tmp_path, "train.log", lines))
    assert [r.mem_peak_bytes for r in s.records] == [(1000 + i) * scale for i in range(8)]


@pytest.mark.parametrize("seed", [31, 32])
@pytest.mark.parametrize("leaks", [False, True])
def test_an_olmo_peak_memory_that_climbs_block_after_block_is_a_leak(
    tmp_path: Path, seed: int, leaks: bool
) -> None:
    """OLMo logs no allocated memory, only its peak per logging interval: a peak that grows at every
    block is a leak; one that holds, with one longer batch's bump, is none."""
    rng = random.Random(seed)
    n = 200
    losses = _curve(n, seed=seed)
    lines = []
    for i in range(n):
        peak = (
            20_000 + rng.randint(-40, 40) + (300 if i == 120 else 0) + (40 * max(0, i - 60) if leaks else 0)
        )
        lines += _olmo_block(10 * (i + 1), 10 * n, losses[i], 1.0, 105_000, peak_mb=peak)
    records = load(_write(tmp_path, "train.log", lines)).records
    found = [(a.kind, a.metric) for a in detect(records) if a.kind.startswith("memory")]
    assert found == ([("memory_leak", "mem_peak_bytes")] if leaks else [])


def test_indented_lines_after_a_line_that_says_more_than_its_step_are_not_its_metrics(tmp_path: Path) -> None:
    """A config printed under a line that names a step among other words stays out of the log."""
    lines = ["Resuming from step 40 with:", "    kl_coef=0.05", "    reward_scale=2.0"]
    lines += [f"step {s} | loss {x:.4f}" for s, x in enumerate(_curve(10, seed=22), start=41)]
    s = load(_write(tmp_path, "train.log", lines))
    assert [r.step for r in s.records] == list(range(41, 51))
    assert not any(k.startswith(("kl", "reward")) for k in s.metrics)

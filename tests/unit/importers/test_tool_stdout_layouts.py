"""What trainers print to stdout, as their own logging code formats it, written here by seeded loops.

Each layout's test fails on a reader that does not know it: the file is unreadable, or it is read
with the wrong steps or values, which is worse (an anomaly at the wrong step, or none).
"""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

import pytest

from steadytune.detect import detect
from steadytune.importers import UnreadableLog, detect_format, load


def _curve(
    n: int, seed: int, spike_at: int | None = None, start: float = 10.2, end: float = 2.3
) -> list[float]:
    """A falling loss with 1% noise; ``spike_at`` (an index) multiplied by 3."""
    rng = random.Random(seed)
    out = [end + (start - end) * math.exp(-i / (n / 6)) * (1 + 0.01 * rng.gauss(0, 1)) for i in range(n)]
    if spike_at is not None:
        out[spike_at] *= 3.0
    return out


def _write(tmp_path: Path, name: str, lines: list[str], end: str = "\n") -> Path:
    p = tmp_path / name
    p.write_text(end.join(lines) + end)
    return p


def _kinds_at(path: Path) -> set[tuple[str, int]]:
    return {(a.kind, a.start_step) for a in detect(load(path).records)}


def _bar(step: int, total: int) -> str:
    pct = 100 * step // total
    return f" {pct:3d}%|{'█' * (pct // 10):<10}| {step}/{total} [00:{step:02d}<00:30,  1.10it/s]"


# --- HF Trainer / TRL / axolotl stdout: printed dicts -----------------------------------------


@pytest.mark.parametrize("every", [1, 5])
@pytest.mark.parametrize("strings", [False, True])  # transformers 5 / TRL print numbers as strings
def test_hf_stdout_dicts_are_dated_by_the_logging_interval_the_bar_gives(
    tmp_path: Path, every: int, strings: bool
) -> None:
    n = 40
    losses = _curve(n, seed=every, spike_at=30)
    lines = ["[INFO|trainer.py:2243] 2024-05-01 12:00:00,123 >> ***** Running training *****"]
    bar = ""
    for i, loss in enumerate(losses):
        step = (i + 1) * every
        for s in range(step - every + 1, step + 1):
            bar += "\r" + _bar(s, n * every)
        v = (lambda x: f"'{x:.4g}'") if strings else (lambda x: repr(round(x, 4)))
        lines.append(
            f"{bar}{{'loss': {v(loss)}, 'grad_norm': {v(1.0 + 0.01 * i)}, "
            f"'learning_rate': {v(2e-5)}, 'epoch': {v(step / (n * every))}}}"
        )
        bar = ""
        if i + 1 == 20:
            lines.append(f"{{'eval_loss': {v(3.1)}, 'eval_runtime': 1.2, 'epoch': {v(0.5)}}}")
    lines.append("{'train_runtime': 30.1, 'train_samples_per_second': 2.1, 'train_loss': 4.2, 'epoch': 1.0}")
    p = _write(tmp_path, "stdout.txt", lines)
    s = load(p)
    assert s.format == "dict_log"
    by_step = {r.step: r for r in s.records}
    assert sorted(by_step) == [(i + 1) * every for i in range(n)]  # no summary row, no extra eval step
    assert by_step[every].loss == pytest.approx(losses[0], rel=1e-3) and by_step[every].grad_norm == 1.0
    assert by_step[20 * every].eval_loss == pytest.approx(3.1)
    assert ("loss_spike", 31 * every) in _kinds_at(p)


def test_hf_stdout_without_a_bar_counts_the_dicts_and_reads_a_bare_nan(tmp_path: Path) -> None:
    losses = _curve(30, seed=3)
    lines = [
        f"{{'loss': {loss:.4f}, 'grad_norm': 1.1, 'learning_rate': 2e-05, 'epoch': {i / 30:.2f}}}"
        for i, loss in enumerate(losses)
    ]
    lines[17] = "{'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 0.57}"
    p = _write(tmp_path, "out.log", lines)  # starts with "{": not JSON, and no longer "invalid JSON"
    assert detect_format(p) == "dict_log"
    assert [r.step for r in load(p).records] == list(range(1, 31))
    assert ("nan_loss", 18) in _kinds_at(p)


# A run cut short (killed: no summary, no total reached) that states no interval: the bar is all
# there is. tqdm.write redraws it after each dict at that dict's step; in between it is redrawn
# when a tenth of a second has passed, so it may show one step short of the next dict (lag 1),
# or nothing newer than the redraw (lag = every: a fast run).
@pytest.mark.parametrize(("every", "lag", "dicts"), [(2, 1, 5), (2, 2, 5), (5, 1, 8), (5, 5, 8)])
def test_hf_stdout_of_a_killed_run_is_dated_by_a_bar_that_lags_its_dicts(
    tmp_path: Path, every: int, lag: int, dicts: int
) -> None:
    total = 100
    losses = _curve(dicts, seed=every + lag)
    lines = []
    for k, loss in enumerate(losses, 1):
        step = k * every
        drawn = max(step - lag, (k - 1) * every)  # the redraw after dict k-1 at least
        bar = "".join("\r" + _bar(s, total) for s in range((k - 1) * every, drawn + 1) if s > 0)
        lines.append(
            f"{bar}\r{' ' * 47}\r{{'loss': '{loss:.4g}', 'grad_norm': '3.4', "
            f"'learning_rate': '9.9e-05', 'epoch': '{0.04 * step:.4g}'}}"
        )
    lines.append(f"\r{_bar(dicts * every, total)}\r{_bar(dicts * every + 1, total)}")  # then killed
    p = _write(tmp_path, "worker-0.log", lines)
    s = load(p)
    assert s.format == "dict_log"
    assert [r.step for r in s.records] == [k * every for k in range(1, dicts + 1)]
    assert [r.loss for r in s.records] == pytest.approx(losses, rel=1e-3)


# A script that trains twice into one stdout (a fit, then a second fit with other settings): the
# Trainer names no step, so its closing summary is where the first run ends. The second logs less
# often than an epoch: its first evaluations come before its first train dict, at their epochs.
def test_hf_stdout_of_two_trainings_in_one_file_is_two_runs(tmp_path: Path) -> None:
    first, second = _curve(6, seed=11), _curve(4, seed=12, start=4.0, end=0.5)
    lines = [
        f"{{'loss': {x:.4f}, 'learning_rate': 2e-05, 'epoch': {(k + 1) / 3:.2f}}}"
        for k, x in enumerate(first)
    ]
    lines.insert(3, "{'eval_loss': 2.5, 'eval_runtime': 16.9, 'epoch': 1.0}")
    lines.append("{'eval_loss': 2.2, 'eval_runtime': 17.1, 'epoch': 2.0}")
    lines.append("{'train_runtime': 99.0, 'train_samples_per_second': 2.0, 'train_loss': 5.1, 'epoch': 2.0}")
    lines.append(_bar(0, 80))  # the second fit: 80 steps, 8 epochs, a train dict every 20 steps
    lines.append("{'eval_loss': 1.9, 'eval_runtime': 1.4, 'epoch': 1.0}")
    lines.append("{'eval_loss': 1.7, 'eval_runtime': 1.0, 'epoch': 2.0}")
    for k, x in enumerate(second, 1):
        lines.append(
            f"\r{_bar(20 * k, 80)}{{'loss': {x:.4f}, 'learning_rate': 1e-05, 'epoch': {2.0 * k:.2f}}}"
        )
    lines.append("{'train_runtime': 50.0, 'train_samples_per_second': 4.0, 'train_loss': 1.0, 'epoch': 8.0}")
    lines.append("{'eval_loss': 0.9, 'eval_runtime': 1.1, 'epoch': 8.0}")  # trainer.evaluate() after
    s = load(_write(tmp_path, "nohup.out", lines))
    one, two = s.runs()
    assert [(r.step, r.loss) for r in one.records if r.loss is not None] == [
        (k, pytest.approx(x, abs=1e-4)) for k, x in enumerate(first, 1)
    ]
    assert [(r.step, r.eval_loss) for r in one.records if r.eval_loss is not None] == [(3, 2.5), (6, 2.2)]
    assert [(r.step, r.loss) for r in two.records if r.loss is not None] == [
        (20 * k, pytest.approx(x, abs=1e-4)) for k, x in enumerate(second, 1)
    ]
    assert [(r.step, r.eval_loss) for r in two.records if r.eval_loss is not None] == [
        (10, 1.9),
        (20, 1.7),
        (80, 0.9),
    ]


def test_hf_stdout_whose_first_training_logged_nothing_is_one_run(tmp_path: Path) -> None:
    # A warm-up fit too short to log (its summary only), then the real training: nothing to split.
    losses = _curve(4, seed=13)
    lines = ["{'train_runtime': 52.4, 'train_samples_per_second': 17.1, 'train_loss': 13.1, 'epoch': 1.0}"]
    lines.append(_bar(0, 400))
    for k, x in enumerate(losses, 1):
        lines.append(f"{{'loss': {x:.4f}, 'grad_norm': 2.3, 'learning_rate': 5e-05, 'epoch': {k - 0.75}}}")
        lines.append(f"{{'eval_loss': {x / 5:.4f}, 'eval_runtime': 15.2, 'epoch': {k - 0.75}}}")
    lines.append("{'train_runtime': 99.0, 'train_samples_per_second': 9.0, 'train_loss': 9.9, 'epoch': 4.0}")
    s = load(_write(tmp_path, "log_train.txt", lines))
    assert len(s.runs()) == 1
    assert [(r.step, r.loss) for r in s.records] == [(100 * k, round(x, 4)) for k, x in enumerate(losses, 1)]


def test_trl_stdout_is_judged_on_its_own_fields(tmp_path: Path) -> None:
    rng = random.Random(5)
    lines = []
    for i in range(40):
        kl = 0.001 * (i + 1) if i < 30 else 2.5  # the policy jumps away from its reference
        lines.append(
            f"[rank0]: {{'loss': '{1e-4 * rng.random():.4g}', 'grad_norm': '{3 + rng.random():.4g}', "
            f"'kl': '{kl:.4g}', 'reward': '{0.3 + 0.01 * i:.4g}', 'reward_std': '0.3', "
            f"'epoch': '{i / 40:.4g}'}}"
        )
    p = _write(tmp_path, "grpo.txt", lines)
    found = detect(load(p).records)
    assert {a.kind for a in found} == {"kl_blowup"}  # and no SFT loss rule on a loss near zero


def test_fairseq_json_lines_after_a_logger_prefix(tmp_path: Path) -> None:
    losses = _curve(30, seed=7, spike_at=20)
    lines = ["2024-05-01 12:00:00 | INFO | fairseq_cli.train | task: translation"]
    for i, loss in enumerate(losses):
        u = 5 * (i + 1)
        lines.append(
            f'2024-05-01 12:00:{i:02d} | INFO | train_inner | {{"epoch": 1, "update": {u / 60:.3f}, '
            f'"loss": "{loss:.3f}", "ppl": "{2**loss:.2f}", "num_updates": "{u}", "gnorm": "{1.5:.3f}"}}'
        )
    p = _write(tmp_path, "train.log", lines)
    s = load(p)
    assert s.format == "dict_log" and [r.step for r in s.records] == [5 * (i + 1) for i in range(30)]
    assert s.records[0].grad_norm == 1.5 and "epoch" in s.metrics
    assert ("loss_spike", 105) in _kinds_at(p)


# --- text lines --------------------------------------------------------------------------------


def test_litgpt_reads_the_train_loss_at_the_optimizer_step_and_its_evals(tmp_path: Path) -> None:
    losses = _curve(40, seed=11, spike_at=30)
    lines = ["Measured TFLOPs: 123.45"]
    for i, loss in enumerate(losses):
        step = i + 1
        lines.append(
            f"Epoch 1 | iter {4 * step} step {step} | loss train: {loss:.3f}, val: n/a | "
            f"iter time: 512.34 ms (step) remaining time: 0:00:59:00"
        )
        if step % 10 == 0:
            lines.append(f"iter {4 * step}: val loss {loss + 0.05:.4f}, val time: 1234.56 ms")
    p = _write(tmp_path, "pretrain.txt", lines)
    s = load(p)
    assert [r.step for r in s.records] == list(range(1, 41))
    assert [x for x, _ in zip(*s.values("eval_loss"), strict=True)] == [10, 20, 30, 40]
    assert s.records[0].loss == pytest.approx(losses[0], abs=1e-3) and s.records[
        0
    ].step_time_s == pytest.approx(0.51234)
    assert ("loss_spike", 31) in _kinds_at(p)


def test_nanotron_human_format_suffixes_are_part_of_the_value(tmp_path: Path) -> None:
    losses = _curve(40, seed=13)
    lines = []
    for i, loss in enumerate(losses):
        norm = "2.5K" if i == 30 else f"{1 + 0.01 * i:.3g}"
        lines.append(
            f"[default0]:05/01/2024 12:00:{i:02d} [INFO|DP=0|PP=0|TP=0|ip-10-0-0-1]: "
            f"iteration: {i + 1} / 40 | consumed_tokens: {131 * (i + 1)}K | tokens_per_sec: 1.06M | "
            f"lm_loss: {loss:.3g} | lr: 6e-05 | grad_norm: {norm}"
        )
    p = _write(tmp_path, "train.log", lines)
    by_step = {r.step: r for r in load(p).records}
    assert by_step[31].grad_norm == 2500.0 and by_step[30].grad_norm == pytest.approx(1.29)
    assert any(k == "grad_explosion" and s == 31 for k, s in _kinds_at(p))


def test_deepspeed_pipeline_engine_steps(tmp_path: Path) -> None:
    losses = _curve(30, seed=17, spike_at=25)
    lines = []
    for i, loss in enumerate(losses):
        lines.append(
            f"[2024-05-01 12:00:01,123] [INFO] [logging.py:96:log_dist] [Rank 0] "
            f"step={i + 1}, skipped=0, lr=[6e-05]"
        )
        lines.append(f"steps: {i + 1} loss: {loss:.4f} iter time (s): 0.512 samples/sec: 250.100")
    p = _write(tmp_path, "pipe.log", lines)
    assert [r.step for r in load(p).records] == list(range(1, 31))
    assert ("loss_spike", 26) in _kinds_at(p)


def test_torchtune_progress_bar_descriptions(tmp_path: Path) -> None:
    losses = _curve(30, seed=19, spike_at=22)
    bar = "".join(
        f"1|{i + 1}|Loss: {loss}:   {i * 3}%|     | {i + 1}/30 [00:01<00:30,  1.95s/it]\r"
        for i, loss in enumerate(losses)
    )
    p = _write(tmp_path, "stdout.txt", ["INFO:torchtune.utils._logging:Model is initialized.", bar])
    s = load(p)
    assert [r.step for r in s.records] == list(range(1, 31)) and s.records[4].loss == losses[4]
    assert ("loss_spike", 23) in _kinds_at(p)


def test_fairseq_simple_progress_lines_count_updates(tmp_path: Path) -> None:
    losses = _curve(30, seed=23)
    lines = [
        f"2024-05-01 12:00:05 | INFO | train_inner | epoch 001:    {5 * (i + 1)} / 150 loss={loss:.3f}, "
        f"ppl=12.1, wps=12345.6, num_updates={5 * (i + 1)}, lr=0.0003, gnorm=2.1, loss_scale=128"
        for i, loss in enumerate(losses)
    ]
    p = _write(tmp_path, "train.log", lines)
    s = load(p)
    assert [r.step for r in s.records] == [5 * (i + 1) for i in range(30)] and s.records[0].grad_norm == 2.1


def test_coloured_logger_lines(tmp_path: Path) -> None:
    losses = _curve(30, seed=29, spike_at=20)
    lines = [
        f"\x1b[32m2024-05-01 12:00:00\x1b[0m | \x1b[1mINFO    \x1b[0m | "
        f"\x1b[36m__main__\x1b[0m:\x1b[36mtrain\x1b[0m:"
        f"\x1b[36m88\x1b[0m - \x1b[1mstep {i + 1} | loss {loss:.4f} | grad_norm 1.2\x1b[0m"
        for i, loss in enumerate(losses)
    ]
    p = _write(tmp_path, "train.log", lines, end="\r\n")
    assert [r.step for r in load(p).records] == list(range(1, 31))
    assert ("loss_spike", 21) in _kinds_at(p)


def test_lines_behind_the_echo_of_keys_typed_into_the_console_are_read(tmp_path: Path) -> None:
    # An arrow key pressed while the run prints is echoed as ``^[[B`` before the next line.
    losses = _curve(30, seed=37, spike_at=20)
    lines = [
        ("^[[B" * (i % 4)) + f"step {i + 1:05d}/00030 | loss: {loss:.6f} | lrm: 1.00 | dt: 475.1ms"
        for i, loss in enumerate(losses)
    ]
    p = _write(tmp_path, "speedrun.log", lines)
    assert [r.step for r in load(p).records] == list(range(1, 31))
    assert ("loss_spike", 21) in _kinds_at(p)


# --- compressed logs ---------------------------------------------------------------------------


def test_a_gzip_compressed_log_is_read_as_its_content(tmp_path: Path) -> None:
    losses = _curve(30, seed=31, spike_at=20)
    p = tmp_path / "train.log.gz"
    p.write_bytes(
        gzip.compress("".join(f"step {i + 1} | loss {x:.4f}\n" for i, x in enumerate(losses)).encode())
    )
    s = load(p)
    assert s.format == "text_log" and s.path == str(p) and detect_format(p) == "text_log"
    assert ("loss_spike", 21) in _kinds_at(p)


def test_a_corrupt_gzip_file_says_so(tmp_path: Path) -> None:
    p = tmp_path / "train.log.gz"
    p.write_bytes(gzip.compress(b"step 1 | loss 2.0\n" * 50)[:30])
    with pytest.raises(UnreadableLog, match="corrupt gzip"):
        load(p)


def test_verl_console_lines_are_an_rl_log_judged_on_its_reward_and_kl(tmp_path: Path) -> None:
    rng = random.Random(37)
    lines = []
    for i in range(40):
        score = 0.2 + 0.015 * i if i < 28 else 0.0  # the policy stops solving the task
        lines.append(
            f"step:{i + 1} - actor/entropy:0.49 - actor/pg_loss:{0.01 * rng.gauss(0, 1)} - "
            f"actor/kl_loss:{0.001 * (i + 1)} - actor/grad_norm:{3 + rng.random()} - actor/lr:1e-06 - "
            f"critic/score/mean:{score} - critic/rewards/mean:{score} - timing_s/step:45.2"
        )
    p = _write(tmp_path, "verl.log", lines)
    s = load(p)
    assert s.format == "dict_log" and [r.step for r in s.records] == list(range(1, 41))
    assert s.records[0].grad_norm is not None and s.records[0].lr == 1e-06
    found = detect(s.records)
    assert [a.kind for a in found] == ["reward_collapse"]


def test_composer_console_headers_and_metric_lines(tmp_path: Path) -> None:
    losses = _curve(30, seed=41, spike_at=20)
    lines = [
        "******************************",
        "Config:",
        "max_seq_len: 2048",
        "******************************",
    ]
    for i, loss in enumerate(losses):
        lines += [
            f"[epoch=1][batch={i + 1}/30]:",
            f"\t Train time/batch: {i}",
            f"\t Train loss/train/total: {loss:.4f}",
            f"\t Train metrics/train/LanguageCrossEntropy: {loss:.4f}",
            "\t Train lr-DecoupledAdamW/group0: 0.0001",
            f"\t Train l2_norm/grad/global: {1.5 - 0.01 * i:.4f}",
        ]
        if (i + 1) % 10 == 0:
            lines += [
                "[Eval batch=1/4] Eval on eval data",
                f"\t Eval metrics/eval/LanguageCrossEntropy: {loss + 0.1:.4f}",
            ]
    p = _write(tmp_path, "console.log", lines)
    s = load(p)
    assert s.format == "composer_console" and [r.step for r in s.records] == list(range(1, 31))
    assert s.records[0].grad_norm == 1.5 and s.records[0].lr == 0.0001
    assert [x for x, _ in zip(*s.values("eval_loss"), strict=True)] == [10, 20, 30]
    assert ("loss_spike", 21) in _kinds_at(p)


def test_nemo1_progress_bar_postfix(tmp_path: Path) -> None:
    losses = _curve(30, seed=43, spike_at=20)
    bar = "".join(
        f"\rEpoch 0:  {3 * i}%|#   | {i + 1}/30 [00:01<00:30, 1.95it/s, v_num=0, reduced_train_loss={x:.3f}, "
        f"global_step={float(i)}, consumed_samples={32.0 * (i + 1)}, train_step_timing in s=0.457]"
        for i, x in enumerate(losses)
    )
    p = _write(tmp_path, "nemo.log", [bar])
    assert [r.step for r in load(p).records] == list(range(30))  # NeMo counts its global step from 0
    assert ("loss_spike", 20) in _kinds_at(p)


def test_every_format_is_in_the_docs_table() -> None:
    from steadytune.importers import FORMATS

    table = (Path(__file__).resolve().parents[3] / "docs" / "detectors.md").read_text()
    assert [f for f in FORMATS if f"| `{f}` |" not in table] == []


def test_nanogpt_evaluation_estimates_stay_out_of_the_training_loss(tmp_path: Path) -> None:
    losses = _curve(100, seed=47)
    lines = []
    for i, loss in enumerate(losses):
        if i % 25 == 0:  # eval_interval 25, log_interval 10: steps 25 and 75 have no iter line
            lines.append(f"step {i}: train loss {loss * 0.9:.4f}, val loss {loss * 1.05:.4f}")
        if i % 10 == 0:
            lines.append(f"iter {i}: loss {loss:.4f}, time 85.30ms, mfu 31.50%")
    p = _write(tmp_path, "train.txt", lines)
    s = load(p)
    assert [x for x, _ in zip(*s.values("loss"), strict=True)] == list(range(0, 100, 10))
    assert [x for x, _ in zip(*s.values("eval_loss"), strict=True)] == [0, 25, 50, 75]


@pytest.mark.parametrize("as_json", [False, True])  # its stdout, and its logging.jsonl
def test_ms_swift_names_its_step_beside_the_total(tmp_path: Path, as_json: bool) -> None:
    losses = _curve(30, seed=53, spike_at=20)
    lines = []
    for i, loss in enumerate(losses):
        step = 5 * (i + 1)
        row = {
            "loss": round(loss, 4),
            "grad_norm": 1.2,
            "learning_rate": 1e-4,
            "memory(GiB)": 17.5,
            "train_speed(iter/s)": 0.4,
            "epoch": round(step / 150, 3),
            "global_step/max_steps": f"{step}/150",
            "percentage": f"{100 * step / 150:.2f}%",
            "elapsed_time": "1m 2s",
        }
        lines.append(json.dumps(row) if as_json else f"Train: {i * 3}%|#| {step}/150 [00:10<00:50]{row!r}")
    p = _write(tmp_path, "logging.jsonl" if as_json else "stdout.txt", lines)
    s = load(p)
    assert s.format == ("jsonl_log" if as_json else "dict_log")
    assert [r.step for r in s.records] == [5 * (i + 1) for i in range(30)]
    assert ("loss_spike", 105) in _kinds_at(p)


def test_lightning_progress_bar_postfix_counts_batches_across_epochs(tmp_path: Path) -> None:
    # self.log("train_loss", loss, prog_bar=True): the bar's count restarts each epoch.
    losses = _curve(60, seed=59, spike_at=45)
    bar = ""
    for i, loss in enumerate(losses):
        epoch, n = divmod(i, 20)
        bar += (
            f"\rEpoch {epoch}:  {5 * (n + 1)}%|#         | {n + 1}/20 [00:0{n % 10}<00:09,  9.50it/s, "
            f"v_num=0, train_loss={loss:.3f}]"
        )
        if n == 19:
            bar += "\n"
    p = _write(tmp_path, "lightning.out", [bar, "`Trainer.fit` stopped: `max_epochs=3` reached."])
    s = load(p)
    assert [r.step for r in s.records] == list(range(1, 61))
    assert ("loss_spike", 46) in _kinds_at(p)


def test_axolotl_stdout_is_dated_by_the_interval_its_config_dump_states(tmp_path: Path) -> None:
    """axolotl prints its config as JSON before training. A run killed early, its bar stale (tqdm
    redraws at most ten times a second): the bar's counts say one step a dict, the config says two."""
    losses = _curve(5, seed=3)
    lines = ["[2026-12-06 04:33:20,140] [INFO] [axolotl.cli.config] config:", "{",
             '  "learning_rate": 0.0001,', '  "logging_steps": 2,', '  "max_steps": 100,', "}"]  # fmt: skip
    for k, loss in enumerate(losses, 1):
        stale = k + (k > 1)  # the bar one step behind the dict after it, but at the first
        lines.append(
            f"{_bar(stale, 100)}{' ' * 8}{{'loss': '{loss:.4g}', 'grad_norm': '4.2', 'epoch': '0.{k}'}}"
        )
    got = load(_write(tmp_path, "train.log", lines))
    assert got.format == "dict_log"
    assert [(r.step, r.loss) for r in got.records] == [
        (2 * k, float(f"{x:.4g}")) for k, x in enumerate(losses, 1)
    ]


@pytest.mark.parametrize("creep", (0.0, 0.02))
def test_verl_sft_validation_loss_is_the_eval_loss(tmp_path: Path, creep: float) -> None:
    # verl's SFT trainer logs `train/loss` at each step and `val/loss` at each test_freq: generated
    # every 500 steps, the validation loss falling, then (creep) rising 2 % an evaluation from the
    # 10th while the training loss keeps falling: overfitting; without the creep, nothing.
    rng = random.Random(41)
    lines = []
    for i in range(1, 31):
        val = 1.4 + 0.8 * math.exp(-i / 3) if i <= 10 else 1.4 * (1 + creep * (i - 10))
        lines.append(
            f"step:{500 * i} - train/loss:{(0.6 + 1.4 * math.exp(-i / 8)) * math.exp(rng.gauss(0, 0.02)):.4f}"
            f" - train/lr(1e-3):0.01 - val/loss:{val * math.exp(rng.gauss(0, 0.005)):.4f}"
        )
    p = _write(tmp_path, "verl_sft.log", lines)
    s = load(p)
    assert s.format == "dict_log" and sum(r.eval_loss is not None for r in s.records) == 30
    assert [a.kind for a in detect(s.records) if a.severity != "info"] == (["overfitting"] if creep else [])

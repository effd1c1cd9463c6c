"""Console captures of custom loops and RL frameworks, each written by a seeded loop in the test.

Every layout carries an anomaly at a known step, and the test asserts the steps and values the
reader gives and that ``analyze``'s detectors see the anomaly at that step.
"""

from __future__ import annotations

import gzip
import math
import random
from pathlib import Path

import pytest

from steadytune.detect import detect
from steadytune.detect.offline import replay_runs
from steadytune.importers import detect_format, load


def _curve(n: int, seed: int, start: float = 6.0, end: float = 2.0, noise: float = 0.01) -> list[float]:
    rng = random.Random(seed)
    return [end + (start - end) * math.exp(-i / (n / 5)) * (1 + noise * rng.gauss(0, 1)) for i in range(n)]


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def _kinds(path: Path) -> set[tuple[str, int]]:
    s = load(path)
    return {(a.kind, a.start_step) for a in replay_runs(s.runs(), s.system).anomalies}


# --- MiniMind and its kin: Epoch:[e/E](n/N) -------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_batch_in_epoch_counts_become_global_steps(tmp_path: Path, seed: int) -> None:
    per_epoch, every = 400, 10
    losses = _curve(2 * per_epoch // every, seed)
    spike = 2 * per_epoch // every - 15  # in the second epoch
    lines = ["LLM总参数量：25.830 百万"]
    for i, loss in enumerate(losses):
        epoch, n = divmod(i * every, per_epoch)
        value = loss * 3 if i == spike else loss
        lines.append(
            f"Epoch:[{epoch + 1}/2]({n}/{per_epoch}) loss:{value:.3f} lr:0.000549999985 epoch_Time:655.0min:"
        )
    p = _write(tmp_path, "pretrain.log", lines)
    s = load(p)
    assert s.format == "text_log"
    assert [r.step for r in s.records] == [i * every for i in range(len(losses))]
    assert s.records[spike].loss == pytest.approx(round(losses[spike] * 3, 3))
    assert ("loss_spike", spike * every) in _kinds(p)


def test_an_rl_console_line_of_any_keys_is_judged_as_rl(tmp_path: Path) -> None:
    rng = random.Random(4)
    lines = []
    for step in range(1, 121):
        loss = "nan" if step == 90 else f"{rng.gauss(0, 0.01):.4f}"
        lines.append(
            f"Epoch:[1/1]({step}/120), Reward: {0.3 + rng.gauss(0, 0.05):.4f}, KL_ref: {0.001:.4f}, "
            f"Adv Std: 0.9248, Actor Loss: {loss}, Avg Response Len: {120 + step}, Learning Rate: 0.00000100"
        )
    p = _write(tmp_path, "grpo.log", lines)
    s = load(p)
    first = s.records[0]
    assert first.step == 1 and first.lr == 1e-6
    assert set(first.extra) >= {"reward", "kl_ref", "adv_std", "avg_response_len"}
    assert first.extra["avg_response_len"] == 121
    judged = replay_runs(s.runs())
    assert judged.objective.startswith("RL")
    assert ("nan_loss", 90) in {(a.kind, a.start_step) for a in judged.anomalies}


# --- verl's console logger behind Ray, as a terminal or W&B captured it ---------------------------


@pytest.mark.parametrize("seed", range(3))
def test_verl_lines_behind_ray_tags_with_numpy_values(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    lines = ["\x1b[36m(TaskRunner pid=14640)\x1b[0m {'actor': {'optim': {'lr': 1e-06}}}"]
    for step in range(1, 61):
        grad = 40.0 if step == 45 else 0.5 + 0.05 * rng.random()
        pairs = [
            f"actor/pg_loss:np.float64({rng.gauss(0, 0.01)})",
            f"actor/grad_norm:np.float64({grad})",
            f"actor/ppo_kl:{1e-4:.6f}",
            f"critic/score/mean:{0.2 + step / 300:.4f}",
            f"critic/rewards/mean:{0.2 + step / 300:.4f}",
            "timing_s/gen:12.5",
        ]
        line = f"\x1b[36m(TaskRunner pid=14640)\x1b[0m step:{step} - " + " - ".join(pairs)
        if step % 10 == 0:
            line = line[: line.rindex(" - ") + 8]  # the capture cut the line: its last pair is lost
        lines.append(line)
    p = _write(tmp_path, "output.log", lines)
    s = load(p)
    assert s.format == "dict_log" and [r.step for r in s.records] == list(range(1, 61))
    assert s.records[44].grad_norm == 40.0
    assert "critic/score/mean" in s.records[0].extra and "timing_s/gen" not in s.records[9].extra
    assert ("grad_spike", 45) in _kinds(p) or ("grad_explosion", 45) in _kinds(p)


# --- lines that name no step ---------------------------------------------------------------------


def test_a_log_of_one_line_per_epoch_is_at_its_epochs(tmp_path: Path) -> None:
    train, val = _curve(30, 5), _curve(30, 6, start=6.5, end=2.6)
    lines = []
    for epoch in range(1, 31):
        lines.append(f"2024-06-13 13:17:19,697 - Training epoch time: {87 + epoch / 10:.3f}s")
        lines.append(
            f"2024-06-13 13:17:32,717 - Epoch: {epoch}, Train loss: {train[epoch - 1]:.3f}, "
            f"Val loss: {val[epoch - 1]:.3f}, Epoch time = 100.710s"
        )
    p = _write(tmp_path, "result.txt", lines)
    s = load(p)
    assert [r.step for r in s.records] == list(range(1, 31))
    assert (s.records[3].loss, s.records[3].eval_loss) == (round(train[3], 3), round(val[3], 3))


def test_a_log_that_counts_nothing_is_numbered_by_its_records(tmp_path: Path) -> None:
    rng = random.Random(7)
    lines = ["Loading model..."]
    for i in range(200):
        loss = 0.0 if i >= 150 else max(0.05, 1.0 - i / 200 + rng.gauss(0, 0.02))
        lines.append(f"Epoch 0, Loss: {loss}, Positive Score: {rng.random():.3f}, Negative Score: 0.4")
    p = _write(tmp_path, "output.log", lines)
    s = load(p)
    assert [r.step for r in s.records] == list(range(1, 201))
    assert s.records[150].loss == 0.0 and s.records[0].extra["positive_score"] <= 1


@pytest.mark.parametrize("seed", range(3))
def test_per_sample_rewards_are_a_mean_and_a_spread(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    lines = ["START vLLM generation..."]
    for i in range(40):
        rewards = [-1.0] * 12 if i >= 10 else [rng.choice([-1.0, 1.0]) for _ in range(12)]
        lines.append("Generated answers: ['I think', 'reward: maybe']")
        lines.append(
            f"time: {7 + rng.random():.2f}s     rewards: tensor([{', '.join(f'{r:.0f}.' for r in rewards)}])"
        )
    p = _write(tmp_path, "grpo.log", lines)
    s = load(p)
    assert [r.step for r in s.records] == list(range(1, 41))
    last = s.records[-1].extra
    assert (last["reward"], last["reward_std"]) == (-1.0, 0.0)
    assert replay_runs(s.runs()).objective == "RL (GRPO/RLOO)"


def test_a_line_without_a_step_belongs_to_the_step_named_last(tmp_path: Path) -> None:
    rng = random.Random(8)
    lines = ["Beginning of Epoch 1/1, Total Generation Batches 60"]
    for step in range(60):
        lines.append(
            f"epoch: 0|step: {step}|ppo_ep: 1|act_loss: {rng.gauss(0, 0.1)}|cri_loss: 0.12|unsuper_loss: 0.0"
        )
        lines.append(f"average reward score: {3.4 + rng.gauss(0, 0.2)}")
        if step == 30:
            lines.append("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536")
    lines.append("saving model ...")
    p = _write(tmp_path, "training.log", lines)
    s = load(p)
    assert [r.step for r in s.records] == list(range(60))
    assert all("reward" in r.extra and "act_loss" in r.extra for r in s.records)
    assert replay_runs(s.runs()).objective.startswith("RL")


def test_a_perplexity_alone_is_the_loss_it_exponentiates(tmp_path: Path) -> None:
    lines = []
    for epoch in range(8):
        lines += [f"***** Evaluating perplexity, Epoch {epoch}/8 *****", f"ppl: {math.exp(3 - epoch / 4)}"]
        lines += ["[INFO] [loss_scaler.py:188:update_scale] OVERFLOW! Skipping step. loss scale: 65536"]
    s = load(_write(tmp_path, "sft.log", lines))
    assert [r.step for r in s.records] == list(range(1, 9))
    assert s.records[4].eval_loss == pytest.approx(3 - 1.0)


# --- progress bars -------------------------------------------------------------------------------


def test_a_bar_postfix_logged_every_k_steps_is_read_at_those_steps(tmp_path: Path) -> None:
    losses = _curve(40, 9)
    drawings = []
    value = None
    for step in range(1, 401):
        if step % 10 == 0:  # set_postfix at the logging step: drawn again at the same count
            drawings.append(f"SFT:  {step // 4}%|#   | {step}/400 [02:09<1:13:19, 12.05s/it, loss {value}]")
            value = f"{losses[step // 10 - 1]:.4f}"
        if value is not None:
            drawings.append(f"SFT:  {step // 4}%|#   | {step}/400 [02:09<1:13:19, 12.05s/it, loss {value}]")
    p = tmp_path / "sft.log"
    p.write_text("\r".join(drawings) + "\n")
    s = load(p)
    assert [r.step for r in s.records] == list(range(10, 401, 10))
    assert [r.loss for r in s.records] == [float(f"{x:.4f}") for x in losses]


def test_a_postfix_logged_at_counts_one_short_of_k_is_read_at_those_counts(tmp_path: Path) -> None:
    """A loop counting from 0 that logs when ``(i + 1) % 10 == 0``: the bar shows the new loss, its
    accuracy and its ETA at counts 9, 19, 29..., and every drawing in between repeats them."""
    losses = _curve(60, 11, start=6.9, end=3.5)
    rng = random.Random(5)
    drawings = []
    loss, acc, eta = "6.9315", "0.00", 42.9
    for count in range(600):
        if count % 10 == 9:
            loss, acc, eta = f"{losses[count // 10]:.4f}", f"{rng.choice((0, 1)):.2f}", eta - 0.1
        post = f"Loss: {loss} | Acc: {acc} | Speed: 0.2 steps/s | ETA: {eta:.1f}h | GPU: 6.4/8.8GB"
        drawings.append(f"{post}:   4%|#    | {count}/24604 [1:49:04<42:30:42,  6.48s/it]")
    p = tmp_path / "dpo.log"
    p.write_text("\r".join(drawings) + "\n")
    s = load(p)
    assert [r.step for r in s.records] == list(range(9, 600, 10))
    assert [r.loss for r in s.records] == [float(f"{x:.4f}") for x in losses]


def test_the_trainer_dicts_inside_one_line_of_bar_drawings(tmp_path: Path) -> None:
    losses = _curve(20, 10, start=1.0, end=0.5)
    line = ["logging_steps=10,"]
    bar = ""
    for step in range(1, 201):
        bar += f"  {step // 2}%|#  | {step}/200 [00:26<3:28:13, 26.53s/it]"
        if step % 10 == 0:
            loss = "nan" if step == 150 else f"{losses[step // 10 - 1]:.4f}"
            bar += (
                f"{{'loss': {loss}, 'grad_norm': 7.29, 'rewards/margins': 0.05, 'epoch': {step / 200:.2f}, "
                f"'train_runtime': {step * 25.0}, 'train_tokens_per_second': 0.0}}"
            )
    line.append(bar)
    line.append("{'train_runtime': 5000.1, 'train_samples_per_second': 1.1, 'train_loss': 0.7")
    line.append("8985166549685, 'epoch': 1.0}")
    p = _write(tmp_path, "outlog.txt", line)
    s = load(p)
    assert [r.step for r in s.records] == list(range(10, 201, 10))
    assert math.isnan(s.records[14].loss)
    assert ("nan_loss", 150) in {(a.kind, a.start_step) for a in detect(s.records)}


# --- where to find the records -------------------------------------------------------------------


def test_a_log_whose_head_and_tail_hold_no_records_is_found_by_its_middle(tmp_path: Path) -> None:
    losses = _curve(300, 11)
    lines = [f" 0:   option_{i} .............................. {i}" for i in range(3000)]
    lines += [
        f" 0:  [2026-05-22 03:10:28.447858] iteration {i + 1}/ 300 | lm loss: {x:.6E} |"
        for i, x in enumerate(losses)
    ]
    lines += [f"50: ', '  File \"dataloader.py\", line {i}, in __next__" for i in range(3000)]
    p = tmp_path / "train.out.gz"
    with gzip.open(p, "wt") as f:
        f.write("\n".join(lines) + "\n")
    assert detect_format(p) == "megatron_text"
    assert [r.step for r in load(p).records] == list(range(1, 301))


def test_records_at_the_step_their_loop_names_on_a_line_of_its_own(tmp_path: Path) -> None:
    """A python-logging capture: "rollout batch N generated", then the batch's record, which names
    no step; two runs appended, the first one's reward falling to zero at batch 8."""
    rng = random.Random(12)
    lines = []
    for run, batches in ((1, 15), (2, 40)):
        for b in range(batches):
            total = 0 if run == 1 and b >= 8 else 140 + rng.randint(-10, 10)
            lines.append(f"2025-09-25 04:03:27,141 - train - INFO - rollout batch {b} generated, length: 256")
            lines.append("2025-09-25 04:06:16,728 - train - INFO - model output: Let's solve it step by step")
            lines.append(
                f"2025-09-25 04:05:16,956 - train - INFO - rl_loss: {rng.gauss(0, 0.003)}, time: 109.8, "
                f"l2_norm: {0.06 + 0.01 * rng.random()}, "
                f"reward_data: {{'total_num': 256, 'total_reward': {total}.0}}"
            )
    s = load(_write(tmp_path, "rl_grpo.log", lines))
    runs = s.runs()
    assert [[r.step for r in run.records] for run in runs] == [list(range(15)), list(range(40))]
    assert [r.extra["reward_data.total_reward"] for r in runs[0].records[8:]] == [0.0] * 7
    assert [r.extra["reward"] for r in runs[0].records[8:]] == [0.0] * 7  # the batch's mean
    assert runs[1].records[0].extra["reward_data.total_num"] == 256

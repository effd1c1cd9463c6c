"""RL logs that carry no loss: TRL's PPOTrainer keeps ``objective/kl``, ``objective/scores`` and
``loss/policy_avg`` in its trainer_state.json, never a ``loss``. Generated in the test by a seeded
loop with the fields the trainer logs; read, judged as RL, on the reward and the KL."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from steadytune.detect.offline import replay
from steadytune.importers import UnreadableLog, load


def _ppo_state(path: Path, seed: int, n: int, kl_jump_at: int | None = None) -> Path:
    rng = random.Random(seed)
    history = []
    for s in range(1, n + 1):
        kl = 0.01 * s**0.8 * math.exp(rng.gauss(0, 0.3))
        if kl_jump_at is not None and s >= kl_jump_at:
            kl *= 40.0
        score = -1.0 + 2.0 * (1 - math.exp(-s / (n / 3))) + rng.gauss(0, 0.2)
        history.append(
            {
                "eps": 3,
                "objective/kl": kl,
                "objective/entropy": 50 + rng.gauss(0, 3),
                "objective/non_score_reward": -0.05 * kl,
                "objective/rlhf_reward": score - 0.05 * kl,
                "objective/scores": score,
                "policy/approxkl_avg": 0.01 * math.exp(rng.gauss(0, 0.3)),
                "policy/clipfrac_avg": 0.05,
                "loss/policy_avg": rng.gauss(0, 0.01),
                "loss/value_avg": 0.5 * math.exp(-s / 50) + abs(rng.gauss(0, 0.02)),
                "val/ratio": 1.0,
                "lr": 3e-6,
                "episode": 64 * s,
                "epoch": s / n,
                "step": s,
            }
        )
    path.write_text(json.dumps({"global_step": n, "log_history": history}))
    return path


@pytest.mark.parametrize("seed", range(4))
def test_a_ppo_trainer_state_without_a_loss_is_read_and_judged_on_its_own_signals(
    tmp_path: Path, seed: int
) -> None:
    series = load(_ppo_state(tmp_path / "trainer_state.json", seed, 200))
    assert len(series.records) == 200 and all(r.loss is None for r in series.records)
    result = replay(series.records)
    assert result.objective == "RL (PPO)"
    assert [a.kind for a in result.anomalies if a.severity != "info"] == []


@pytest.mark.parametrize("seed", range(4))
def test_a_ppo_kl_that_jumps_is_a_blowup_where_it_jumped(tmp_path: Path, seed: int) -> None:
    series = load(_ppo_state(tmp_path / "trainer_state.json", seed, 200, kl_jump_at=150))
    got = [(a.kind, a.start_step) for a in replay(series.records).anomalies if a.severity != "info"]
    assert got == [("kl_blowup", 150)]


def test_a_log_with_neither_a_loss_nor_an_rl_signal_still_says_what_it_looked_for(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"log_history": [{"step": s, "learning_rate": 1e-5} for s in range(1, 9)]}))
    with pytest.raises(UnreadableLog, match=r"loss, eval_loss, grad_norm.*nor an RL or preference signal"):
        load(path)

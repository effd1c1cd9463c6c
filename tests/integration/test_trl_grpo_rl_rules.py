"""Post-training rules on the real `trl grpo` (TRL 1.16) under `supervise --inject`, on the demo model.

A run with no learning signal is told to the user, not restarted (a restart cannot fix a reward
function); a reward collapse is rolled back to the last good checkpoint with a lower LR (the "hard
reset"). A healthy run raises nothing: test_trl_preference.py holds that one
(test_trl_grpo_whose_batches_often_tie_raises_no_gradient_anomaly), and the KL blow-up rolled back.
The rules: detect/learning.py, detect/reward.py, detect/kl.py; the policy: config/policy.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from steadytune.records import run_end

from .toolruns import supervise, trl_job

pytestmark = [pytest.mark.slow, pytest.mark.tools("trl")]

REPO = Path(__file__).resolve().parents[2]
REWARDS = "tests.integration.grpo_rewards"


def _anomalies(events: list) -> list[tuple[str, int | None, str | None]]:
    return [(e.name, e.step, e.data.get("metric")) for e in events if e.kind == "anomaly"]


def test_trl_grpo_whose_reward_never_fires_raises_no_learning_signal_live_once(
    tmp_path: Path, demo_assets: Path
) -> None:
    """A reward function that always returns 0: every group ties, no advantage, no gradient (TRL logs
    reward 0, reward_std 0, frac_reward_zero_std 1, grad_norm 0 at every step). Before, the guard's
    gradient flow raised five grad_vanishing warnings at step 1 (one per layer, with SFT advice) and
    nothing after."""
    steps = 20
    job = trl_job(demo_assets, tmp_path, steps, trainer="grpo", save_steps=steps, logging_steps=1,
                  reward_funcs=f"{REWARDS}.always_zero")  # fmt: skip
    job.env["PYTHONPATH"] += os.pathsep + str(REPO)
    with supervise(job, tmp_path, "--inject") as sup:
        rc = sup.finish()
    assert rc == 0, sup.stdout
    events, recs = sup.events(), sup.steps()
    # The run is the case in point: nothing to learn from at any step.
    assert all(r.extra.get("frac_reward_zero_std") == 1.0 and r.grad_norm == 0.0 for r in recs)
    # One episode, dated where the window without signal began, raised within 20 steps.
    assert _anomalies(events) == [("no_learning_signal", 1, "frac_reward_zero_std")]
    anomaly = next(e for e in events if e.kind == "anomaly")
    assert anomaly.data["severity"] == "warning" and anomaly.data["evidence"]["learning_share"] == 0.0
    assert "reward function" in anomaly.data["cause"]
    names = [e.name for e in events]
    assert "rollback" not in names and "restart" not in names and run_end(events).name == "run_completed"
    assert anomaly.data["evidence"]["to_step"] <= 20  # the step it was raised at


def test_trl_grpo_driven_into_a_reward_collapse_is_rolled_back_with_a_lower_lr_and_completes(
    tmp_path: Path, demo_assets: Path
) -> None:
    """The reward: how varied a completion is (distinct characters). Three updates at 3000x the LR
    (the lr_burst drill fault, applied by the guard inside the trainer in the first attempt only)
    collapse the policy into repeating a few tokens: the entropy falls from 6.2 to 0.7, the reward
    from about 0.65 to 0.25 and stays there. The KL jumps as well (its rollback is held back here,
    so that the rollback is the collapse's)."""
    steps, burst, lr = 30, 12, 1e-4
    faults = {"lr_burst_at_step": burst, "lr_burst_factor": 3000, "lr_burst_steps": 3}
    job = trl_job(demo_assets, tmp_path, steps, trainer="grpo", save_steps=5, logging_steps=1, lr=lr,
                  reward_funcs=f"{REWARDS}.distinct_characters")  # fmt: skip
    job.env["PYTHONPATH"] += os.pathsep + str(REPO)
    cfg = tmp_path / "supervise.yaml"
    cfg.write_text("policy:\n  rules:\n    kl_blowup: {action: alert}\n")
    env = {"STEADYTUNE_FAULTS": json.dumps(faults)}
    with supervise(job, tmp_path, "--inject", "--config", str(cfg), "--base-lr", str(lr), env=env) as sup:
        rc = sup.finish()
    assert rc == 0, sup.stdout
    events = sup.events()
    names = [e.name for e in events]
    rollback = names.index("rollback")
    collapse = next(e for e in events[:rollback] if e.kind == "anomaly" and e.name == "reward_collapse")
    assert burst < collapse.step <= burst + 4 and collapse.data["metric"] == "reward"
    assert collapse.data["evidence"]["best_level"] > collapse.data["evidence"]["value"]
    assert "entropy" in collapse.data["cause"]
    plan = [json.loads(line) for line in (sup.run / "plan.jsonl").read_text().splitlines()]
    assert plan[1]["reason"] == "reward_collapse" and plan[1]["lr_scale"] == pytest.approx(0.5)
    assert plan[1]["resume_checkpoint"].endswith("checkpoint-10")  # the last one before the burst
    restarted = events[names.index("worker_started", rollback)]
    assert restarted.data["cmd"][-2:] == ["--learning_rate", f"{lr * 0.5:g}"]
    first, after = [r for r in sup.steps() if r.attempt == 0], [r for r in sup.steps() if r.attempt >= 1]
    # The collapse was real, and the run after the rollback is healthy: its reward back where it was.
    assert min(r.extra["reward"] for r in first if r.step > burst + 2) < 0.4
    assert after[0].step == 11 and after[-1].step == steps
    assert min(r.extra["reward"] for r in after) > 0.4
    assert sum(1 for n in names if n == "rollback") == 1 and run_end(events).name == "run_completed"

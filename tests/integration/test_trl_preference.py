"""The real `trl dpo` and `trl grpo` (TRL 1.16) on the demo model: read by `analyze`, run under `supervise`.

Preference and RL runs are judged on their own signals (detect/objective.py), not by the
SFT loss rules. Here that is checked on what the real trainers write: their printed log
dicts under `supervise`, and the trainer_state.json of their checkpoints under `analyze`.
DPO trains on the demo's preference rows, GRPO on the demo prompts with the demo's
brevity reward (train/assets.py). The jobs and the supervise scaffolding are in toolruns.py.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from steadytune.objectives import SIGNED_OBJECTIVE
from steadytune.records import Event, run_end

from .runs import STEADYTUNE
from .toolruns import ToolJob, all_finite, supervise, trl_job

pytestmark = [pytest.mark.slow, pytest.mark.tools("trl")]

# Each TRL trainer's own fields: every record must carry them, as the tool logged them.
DPO_FIELDS = {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen"}
GRPO_FIELDS = {"reward", "reward_std", "kl", "frac_reward_zero_std", "completions/mean_length", "entropy"}
# What the SFT loss rules raise; an RL or preference run's loss is only checked for NaN/Inf.
LOSS_RULES = {"loss_spike", "divergence", "loss_collapse", "plateau", "oscillation"}
RL_RULES = {"reward_collapse", "kl_blowup"}


def _analyze(*paths: Path) -> tuple[int, list[dict[str, Any]]]:
    """`steadytune analyze --format json PATHS` as a user runs it: its exit code and its files."""
    proc = subprocess.run(
        [STEADYTUNE, "analyze", "--format", "json", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert not proc.stderr.strip() or proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)["files"]


def _logged(state: Path) -> dict[int, dict[str, Any]]:
    """The training entries of a trainer_state.json by step: what the trainer logged for each."""
    return {e["step"]: e for e in json.loads(state.read_text())["log_history"] if "loss" in e}


def _logged_steps(state: Path) -> list[int]:
    """The steps of the training entries of a trainer_state.json (its run summary is not one)."""
    history = json.loads(state.read_text())["log_history"]
    return [e["step"] for e in history if "loss" in e]


def _anomalies(events: list[Event]) -> list[str]:
    return [e.name for e in events if e.kind == "anomaly"]


def _run_tool(job: ToolJob, timeout: float = 300) -> None:
    """The job run bare, as its users run it, to its end."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **job.env}
    proc = subprocess.run(job.cmd, capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def test_trl_dpo_under_supervise_is_judged_as_preference_and_resumes_a_killed_trainer(
    tmp_path: Path, demo_assets: Path
) -> None:
    steps = 300
    job = trl_job(demo_assets, tmp_path, steps, trainer="dpo")
    with supervise(job, tmp_path) as sup:
        sup.wait_checkpoint(50)
        trainer = sup.trainer()
        os.kill(trainer.pid, signal.SIGKILL)
        rc = sup.finish()
    assert rc == 0, sup.stdout
    events = sup.events()
    restarts = [e for e in events if e.kind == "action" and e.name == "restart"]
    assert len(restarts) == 1 and "resuming from checkpoint-" in restarts[0].message
    resumed_from = int(restarts[0].message.split("checkpoint-")[1].split()[0])
    assert run_end(events).name == "run_completed"
    # DPO's loss falls from ln 2 by design: nothing is raised on it, nor on anything else.
    assert _anomalies(events) == []
    recs = sup.steps()
    assert recs[0].loss == pytest.approx(math.log(2), abs=0.01) and min(r.loss for r in recs[-10:]) < 0.6
    # Every record carries DPO's own fields, as TRL printed them; the grad norm and LR in their fields.
    assert all(set(r.extra) >= DPO_FIELDS for r in recs), [sorted(r.extra) for r in recs[:1]]
    assert all(r.grad_norm is not None and r.lr is not None for r in recs)
    second = [r.step for r in recs if r.attempt == 1]
    assert second[0] == resumed_from + 5 and second[-1] == steps
    status = sup.status()
    assert status["state"] == "completed" and status["step"] == status["max_steps"] == steps
    assert status["last_checkpoint"] == f"checkpoint-{steps}"
    assert all_finite(job.out / job.weights_file)
    # `analyze` on the trainer_state.json TRL wrote: judged as DPO, healthy, every entry read.
    state = job.checkpoint(steps) / "trainer_state.json"
    rc, (found,) = _analyze(state)
    assert rc == 0 and found["objective"] == "preference (DPO)" and found["anomalies"] == []
    assert found["steps"] == len(_logged_steps(state)) == steps // 5
    assert set(found["metrics"]) >= DPO_FIELDS


def test_trl_grpo_under_supervise_is_judged_on_its_reward_not_its_near_zero_loss(
    tmp_path: Path, demo_assets: Path
) -> None:
    steps = 40
    job = trl_job(demo_assets, tmp_path, steps, trainer="grpo", save_steps=20, logging_steps=2)
    with supervise(job, tmp_path) as sup:
        rc = sup.finish()
    assert rc == 0, sup.stdout
    events = sup.events()
    assert _anomalies(events) == [] and run_end(events).name == "run_completed"
    recs = sup.steps()
    assert [r.step for r in recs] == list(range(2, steps + 1, 2))
    assert all(set(r.extra) >= GRPO_FIELDS for r in recs), [sorted(r.extra) for r in recs[:1]]
    assert sup.status()["state"] == "completed"
    state = job.checkpoint(steps) / "trainer_state.json"
    rc, (found,) = _analyze(state)
    assert rc == 0 and found["objective"] == "RL (GRPO/RLOO)" and found["anomalies"] == []
    assert found["steps"] == len(_logged_steps(state)) == steps // 2
    # The same log read without GRPO's own fields: its loss goes below zero, which no cross-entropy does,
    # so from then on it is not read by the SFT loss rules, and it is never a collapse (before: a collapse,
    # its loss being near zero). Its first points, positive (1e-5 to 1e-4), are still read as a
    # cross-entropy until then: a spike and a divergence in log space, closed once it goes negative
    # (what remains: the rules cannot know the objective before the loss shows it).
    plain = json.loads(state.read_text())
    kept = ("step", "loss", "grad_norm", "learning_rate", "epoch")
    plain["log_history"] = [{k: v for k, v in e.items() if k in kept} for e in plain["log_history"]]
    (tmp_path / "plain.json").write_text(json.dumps(plain))
    rc, (as_sft,) = _analyze(tmp_path / "plain.json")
    assert min(e["loss"] for e in plain["log_history"] if "loss" in e) < 0.0
    assert as_sft["objective"] == SIGNED_OBJECTIVE
    assert "loss_collapse" not in {a["kind"] for a in as_sft["anomalies"]}, as_sft["anomalies"]


def test_trl_grpo_whose_batches_often_tie_raises_no_gradient_anomaly(
    tmp_path: Path, demo_assets: Path
) -> None:
    """One prompt group of four a step and a binary reward: many batches tie, their gradient is the KL
    term's alone (about 0.01 against 2), and the norm drops and comes back. Live under `supervise`, in
    `analyze`, and in `analyze` of the same log without the fields that say a batch tied, that is not
    a gradient spike, explosion or vanishing (before RL runs were gated: two explosions by step 12)."""
    steps = 40
    reward = "tests.integration.grpo_rewards.one_in_five"
    job = trl_job(demo_assets, tmp_path, steps, trainer="grpo", save_steps=steps, logging_steps=1,
                  reward_funcs=reward)  # fmt: skip
    job.env["PYTHONPATH"] += os.pathsep + str(Path(__file__).resolve().parents[2])
    with supervise(job, tmp_path) as sup:
        rc = sup.finish()
    assert rc == 0, sup.stdout
    assert _anomalies(sup.events()) == []
    state = job.checkpoint(steps) / "trainer_state.json"
    history = [e for e in json.loads(state.read_text())["log_history"] if "grad_norm" in e]
    tied = [e["grad_norm"] for e in history if e["frac_reward_zero_std"] == 1.0]
    learning = [e["grad_norm"] for e in history if e["frac_reward_zero_std"] < 1.0]
    # The run is the case in point: batches of both kinds, the tied ones' norms far below the others.
    assert len(tied) >= 5 and len(learning) >= 5 and max(tied) * 8 < min(learning), (tied, learning)
    rc, (found,) = _analyze(state)
    assert rc == 0 and found["objective"] == "RL (GRPO/RLOO)" and found["anomalies"] == []
    bare = json.loads(state.read_text())
    for e in bare["log_history"]:
        e.pop("frac_reward_zero_std", None)
        e.pop("reward_std", None)
    (tmp_path / "bare.json").write_text(json.dumps(bare))
    rc, (found,) = _analyze(tmp_path / "bare.json")
    assert rc == 0 and found["anomalies"] == [], found["anomalies"]


def test_trl_grpo_under_supervise_inject_is_judged_as_rl_on_the_fields_trl_logs(
    tmp_path: Path, demo_assets: Path
) -> None:
    """With the guard inside GRPOTrainer the step records are the guard's, one per step; the record of a
    step TRL logs is written when it logs, with TRL's reward and KL in it, and the first one names the
    objective from the trainer's class (step 1 is not logged here). Read by the SFT loss rules, GRPO's
    loss (exactly 0 at the first step, then 1e-5 and so on) was a collapse and a divergence, and rolled
    back a healthy run."""
    steps = 20
    job = trl_job(demo_assets, tmp_path, steps, trainer="grpo", save_steps=10, logging_steps=2)
    with supervise(job, tmp_path, "--inject") as sup:
        rc = sup.finish()
    assert rc == 0, sup.stdout
    events = sup.events()
    injected = next(e for e in events if e.name == "guard_injected")
    assert injected.data["trainer"].endswith("GRPOTrainer")
    assert _anomalies(events) == [] and "rollback" not in [e.name for e in events]
    recs = sup.steps()
    assert [r.step for r in recs] == list(range(1, steps + 1))  # the guard's: every step
    assert recs[0].extra["objective"] == "RL (GRPO/RLOO)"
    logged = _logged(job.checkpoint(steps) / "trainer_state.json")
    assert sorted(logged) == list(range(2, steps + 1, 2))
    for r in recs:
        if r.step in logged:
            assert set(r.extra) >= GRPO_FIELDS, sorted(r.extra)
            assert (r.extra["reward"], r.extra["kl"]) == (logged[r.step]["reward"], logged[r.step]["kl"])
        else:
            assert not set(r.extra) & GRPO_FIELDS
    assert run_end(events).name == "run_completed" and sup.status()["state"] == "completed"
    rc, (found,) = _analyze(sup.run)
    assert rc == 0 and found["objective"] == "RL (GRPO/RLOO)" and found["anomalies"] == []
    assert set(found["metrics"]) >= GRPO_FIELDS


def test_trl_grpo_whose_kl_blows_up_under_supervise_inject_is_flagged_on_the_step_trl_logged_it(
    tmp_path: Path, demo_assets: Path
) -> None:
    """One update at 20000x the LR (the lr_burst drill fault: the guard inside the trainer applies it)
    throws the policy far from its reference: TRL's kl goes from 0.013 to 2.75 at the next step (270x
    its recent level), while its reward climbs (shorter completions). Live under --inject that is
    kl_blowup on the step TRL logged it, as `analyze` finds it in the log TRL itself kept. (The
    policy only watches here: acting, it rolls a KL blow-up back, and TRL's log would be the
    second attempt's; test_trl_grpo_rl_rules.py rolls a collapse back.)"""
    steps, burst = 18, 13
    faults = {"lr_burst_at_step": burst, "lr_burst_factor": 20000, "lr_burst_steps": 1}
    job = trl_job(demo_assets, tmp_path, steps, trainer="grpo", save_steps=steps, logging_steps=1)
    env = {"STEADYTUNE_FAULTS": json.dumps(faults)}
    with supervise(job, tmp_path, "--inject", "--policy", "observe", env=env) as sup:
        rc = sup.finish()
    assert rc == 0, sup.stdout
    events = sup.events()
    blowups = [e for e in events if e.kind == "anomaly" and e.name == "kl_blowup"]
    assert [e.step for e in blowups] == [burst + 1], _anomalies(events)
    assert blowups[0].data["metric"] == "kl" and blowups[0].data["evidence"]["ratio"] > 10
    assert not set(_anomalies(events)) & LOSS_RULES
    state = job.checkpoint(steps) / "trainer_state.json"
    logged = _logged(state)
    recs = sup.steps()
    assert [r.step for r in recs] == sorted(logged) == list(range(1, steps + 1))
    assert all(r.extra["kl"] == logged[r.step]["kl"] for r in recs)
    # TRL's own log (the fields `supervise` without --inject reads) and the run directory, in `analyze`.
    for path in (state, sup.run):
        rc, (found,) = _analyze(path)
        assert rc == 1 and found["objective"] == "RL (GRPO/RLOO)"
        rl = [(a["kind"], a["metric"], a["start_step"]) for a in found["anomalies"] if a["kind"] in RL_RULES]
        assert rl == [("kl_blowup", "kl", burst + 1)], found["anomalies"]


def test_trl_dpo_at_an_lr_far_too_high_is_a_grad_explosion_in_analyze(
    tmp_path: Path, demo_assets: Path
) -> None:
    """At LR 3.0 TRL's DPO wrecks the demo model in its first update: the grad norm goes from about 1.5
    to over a hundred at the second step and stays there, the loss from ln 2 to tens and hundreds."""
    steps = 12
    job = trl_job(demo_assets, tmp_path, steps, trainer="dpo", save_steps=steps, logging_steps=1, lr=3.0)
    _run_tool(job)
    state = job.checkpoint(steps) / "trainer_state.json"
    rc, (found,) = _analyze(state)
    assert rc == 1 and found["objective"] == "preference (DPO)"
    assert found["steps"] == len(_logged_steps(state)) == steps
    explosion = next(a for a in found["anomalies"] if a["kind"] == "grad_explosion")
    assert (explosion["severity"], explosion["metric"]) == ("critical", "grad_norm")
    norms = [e["grad_norm"] for e in json.loads(state.read_text())["log_history"] if "grad_norm" in e]
    # Dated where the norm left the first one far behind (the spike ratio, 8x), not where the storm
    # happened to pass 100x: which step that is depends on the numerics of the versions installed.
    first_jump = 1 + next(i for i, g in enumerate(norms) if g > 8 * norms[0])
    assert explosion["start_step"] == first_jump <= 4 and explosion["evidence"]["ratio_to_first"] >= 8
    assert not {a["kind"] for a in found["anomalies"]} & LOSS_RULES
    text = subprocess.run([STEADYTUNE, "analyze", str(state)], capture_output=True, text=True, timeout=120)
    assert "judged as preference (DPO)" in text.stdout and "grad_explosion" in text.stdout, text.stdout


def test_trl_dpo_at_lr_0_15_whose_grad_norm_storms_and_margins_turn_negative_is_flagged(
    tmp_path: Path, demo_assets: Path
) -> None:
    """At LR 0.15 over 40 steps the grad norm goes 1.5 -> 3.9 -> 38 -> 74 -> 179 (step 5, 116x its
    first), storms on to 222, 336 and 894 (steps 11, 17, 18: 580x) and settles near 1; the loss climbs
    from ln 2 to 4.2, 6.6 and 5.9 and the margins go negative (to -6.5): the policy prefers the
    rejected answers for a while.

    Written at LR 0.1 over 24 steps (1.5 -> 8.5 -> 34 -> 193 -> 353, about 230x). With the TRL venv's
    unpinned dependencies as resolved later that run storms at about 50x (77.8 from 1.54), under the
    100x the explosion rule needs; at LR 0.12 over 40 steps at 97x. At LR 0.15 over 40 steps analyze
    raises the critical grad_explosion at 218x the first norm; with the rule's ratio raised out of
    reach (analyze --set grad.explosion_ratio=1000) the same log raises none, and this test fails."""
    steps = 40
    job = trl_job(demo_assets, tmp_path, steps, trainer="dpo", save_steps=steps, logging_steps=1, lr=0.15)
    _run_tool(job)
    history = json.loads((job.checkpoint(steps) / "trainer_state.json").read_text())["log_history"]
    assert max(e["grad_norm"] for e in history if "grad_norm" in e) > 100 * history[0]["grad_norm"]
    rc, (found,) = _analyze(job.checkpoint(steps) / "trainer_state.json")
    assert found["objective"] == "preference (DPO)"
    assert rc == 1 and any(a["severity"] != "info" for a in found["anomalies"]), found["anomalies"]
    # The storm is judged against where the run began, not only against its recent level.
    explosion = next(a for a in found["anomalies"] if a["kind"] == "grad_explosion")
    assert explosion["severity"] == "critical" and explosion["evidence"]["ratio_to_first"] > 100


def test_trl_dpo_at_an_lr_far_too_high_is_rolled_back_live_with_a_lower_lr(
    tmp_path: Path, demo_assets: Path
) -> None:
    steps, lr, scale = 40, 3.0, 0.001
    job = trl_job(demo_assets, tmp_path, steps, trainer="dpo", save_steps=10, logging_steps=1, lr=lr)
    cfg = tmp_path / "supervise.yaml"
    cfg.write_text(f"policy:\n  rollback_lr_scale: {scale}\n")
    with supervise(job, tmp_path, "--config", str(cfg), "--base-lr", str(lr)) as sup:
        rc = sup.finish()
    assert rc == 0, sup.stdout
    events = sup.events()
    names = [e.name for e in events]
    rollback = names.index("rollback")
    # The norm's jump is a spike and, held up or at over 100x, an explosion: one trouble, told once as
    # the explosion (the spike is part of it), and the explosion is what the rollback was for.
    before = [e for e in events[:rollback] if e.kind == "anomaly"]
    assert {e.name for e in before} == {"grad_explosion"}, _anomalies(events)
    explosion = next(e for e in before if e.name == "grad_explosion")
    assert explosion.step is not None and explosion.step <= 4
    assert not set(_anomalies(events)) & LOSS_RULES
    plan = [json.loads(line) for line in (sup.run / "plan.jsonl").read_text().splitlines()]
    assert plan[1]["reason"] == "grad_explosion" and plan[1]["lr_scale"] == pytest.approx(scale)
    restarted = events[names.index("worker_started", rollback)]
    assert restarted.data["cmd"][-2:] == ["--learning_rate", f"{lr * scale:g}"]
    # TRL trained on at the lowered LR, by its own logged LR, to the end, with finite weights.
    after = [r for r in sup.steps() if r.attempt >= 1]
    assert after and all(r.lr is not None and r.lr <= lr * scale * 1.0001 for r in after)
    assert after[-1].step == steps and run_end(events).name == "run_completed"
    assert all_finite(job.out / job.weights_file)

"""The policy is pure: anomalies in, actions out, within budgets."""

from __future__ import annotations

from steadytune.config.policy import PolicyConfig
from steadytune.policy.engine import Policy
from steadytune.policy.plan import (
    choose_rollback_checkpoint,
    merge_ranges,
    oom_escalation,
    rollback_plan,
    smaller_microbatch,
    to_ranges,
)
from steadytune.records import Anomaly, PlanRevision


def anomaly(kind: str, start: int, severity: str = "warning", metric: str = "loss") -> Anomaly:
    return Anomaly(kind, severity, start, start, metric)


def test_a_spike_is_acted_on_only_once_it_persists() -> None:
    pol = Policy(PolicyConfig(spike_confirm_points=3))
    spike = anomaly("loss_spike", 50)
    assert pol.on_raised(spike, 50) is None
    assert pol.on_step(51) == []
    actions = pol.on_step(52)
    assert [a.name for a in actions] == ["rollback"] and actions[0].anomaly == spike
    assert pol.on_step(53) == []  # acted once


def test_a_spike_that_recovers_is_left_alone() -> None:
    pol = Policy(PolicyConfig(spike_confirm_points=3))
    spike = anomaly("loss_spike", 50)
    pol.on_raised(spike, 50)
    pol.on_resolved(spike)
    assert pol.on_step(60) == []


def test_trouble_back_at_its_step_on_the_new_timeline_is_acted_on_again_within_the_budget() -> None:
    pol = Policy(PolicyConfig(spike_confirm_points=1, max_rollbacks=2))
    assert pol.on_raised(anomaly("kl_blowup", 10, metric="kl"), 10).name == "rollback"
    assert pol.on_raised(anomaly("kl_blowup", 10, metric="kl"), 11) is None  # the same incident
    pol.forget_open(8)  # resumed from checkpoint-8: step 10 is trained again
    assert pol.on_raised(anomaly("kl_blowup", 10, metric="kl"), 10).name == "rollback"
    pol.forget_open(4)
    assert pol.on_raised(anomaly("kl_blowup", 10, metric="kl"), 10).name == "alert"  # budget spent
    # An incident from before the resume step was on the timeline the new one shares: acted on once.
    pol = Policy()
    assert pol.on_raised(anomaly("stall", 5), 5).name == "restart"
    pol.forget_open(6)
    assert pol.on_raised(anomaly("stall", 5), 7) is None


def test_safe_mode_style_immediate_rollback_and_the_budget() -> None:
    pol = Policy(PolicyConfig(spike_confirm_points=1, max_rollbacks=2))
    names = [pol.on_raised(anomaly("loss_spike", s), s).name for s in (10, 20, 30)]
    assert names == ["rollback", "rollback", "alert"]


def test_observe_mode_only_alerts() -> None:
    pol = Policy(PolicyConfig(mode="observe"))
    act = pol.on_raised(anomaly("divergence", 5, "critical"), 5)
    assert act.name == "alert" and "would rollback" in act.reason


def test_severity_floor_and_alert_only_kinds() -> None:
    pol = Policy()
    assert pol.on_raised(anomaly("divergence", 5, "warning"), 5) is None  # rule wants critical
    assert pol.on_raised(anomaly("plateau", 5), 5) is None
    assert pol.on_raised(anomaly("stall", 5), 5).name == "restart"
    assert (
        pol.on_raised(anomaly("memory_leak", 7, metric="mem_allocated_bytes"), 7).name == "reduce_microbatch"
    )


def test_rules_from_config_merge_over_defaults() -> None:
    pol = Policy(PolicyConfig.model_validate({"rules": {"stall": {"action": "alert"}}}))
    assert pol.on_raised(anomaly("stall", 5), 5) is None
    assert pol.config.rule("divergence").action == "rollback"


def test_consecutive_skips_escalate_to_rollback_once() -> None:
    pol = Policy(PolicyConfig(nan_rollback_after=3))
    assert pol.on_skipped_update(10, 1) is None and pol.on_skipped_update(11, 2) is None
    act = pol.on_skipped_update(12, 3)
    assert act.name == "rollback" and act.anomaly.start_step == 10
    assert pol.on_skipped_update(12, 3) is None


def test_ranges() -> None:
    assert to_ranges([7, 1, 2, 3, 8, 2]) == ((1, 3), (7, 8))
    assert merge_ranges(((1, 3),), ((4, 6), (10, 12)), ((11, 20),)) == ((1, 6), (10, 20))


def test_rollback_goes_further_back_when_the_trouble_repeats() -> None:
    steps = [10, 20, 30, 40]
    assert choose_rollback_checkpoint(35, steps, []) == 30
    assert choose_rollback_checkpoint(34, steps, [30]) == 20
    assert choose_rollback_checkpoint(12, steps, [10]) == 0
    assert choose_rollback_checkpoint(12, steps, [10, None]) is None


def test_trouble_back_soon_after_a_rollback_goes_before_its_checkpoint_not_to_a_later_one() -> None:
    # An LR far too high: trouble at 4, rolled back to 3; again at 4, to 2; then at 5, on the timeline
    # resumed from 2, which wrote checkpoints 3 and 4 since. Those descend from 2: not further back.
    steps = [1, 2, 3, 4]
    assert choose_rollback_checkpoint(5, steps, [3, 2]) == 4  # without a window: only exact repeats count
    assert choose_rollback_checkpoint(5, steps, [3, 2], came_back_within=10) == 1
    assert choose_rollback_checkpoint(5, steps, [3, 2, 1], came_back_within=10) == 0
    assert choose_rollback_checkpoint(5, steps, [3, 2, 1, None], came_back_within=10) is None
    # Far past the window, the timeline had left it behind: a new incident, the newest before it.
    assert choose_rollback_checkpoint(40, [*steps, 30, 35], [2], came_back_within=10) == 35


def test_without_its_samples_a_rollback_does_not_resume_the_weights_that_made_the_bad_step() -> None:
    from pathlib import Path

    from steadytune.policy.engine import Action
    from steadytune.supervise.restarts import rollback_restart

    plan = PlanRevision(revision=0, ts=0, reason="start")
    bad = Anomaly("nonfinite_grad", "warning", 4, 4, "grad_norm")
    action = Action("rollback", "nonfinite_grad", 4, bad)
    # checkpoint-3 holds the weights step 4 was computed on: resumed with step 4's batch, step 4 again.
    _, _, _, target = rollback_restart(plan, action, [1, 2, 3], [], Path("/ck"), 4, {}, 0.001)
    assert target == 2
    # Where step 4's samples are known, they are skipped: checkpoint-3 is the way out.
    changes, _, _, target = rollback_restart(plan, action, [1, 2, 3], [], Path("/ck"), 4, {4: [7, 8]}, 0.001)
    assert target == 3 and changes is not None and changes["skip_ranges"] == ((7, 8),)
    # A divergence confirmed at 4 that began at 3 (since_step): checkpoint-2 made step 3.
    diverged = Anomaly("divergence", "critical", 4, 4, "loss", {"since_step": 3})
    action = Action("rollback", "divergence", 4, diverged)
    assert rollback_restart(plan, action, [2], [], Path("/ck"), 4, {}, 0.001)[3] == 0
    assert rollback_restart(plan, action, [2], [], Path("/ck"), 4, {3: [5], 4: [6]}, 0.001)[3] == 2


def test_rollback_plan_skips_the_window_and_scales_the_lr() -> None:
    cur = PlanRevision(revision=1, ts=0, reason="start", lr_scale=1.0, skip_ranges=((100, 101),))
    samples = {19: [1, 2], 21: [5, 6], 22: [7, 8], 30: [50]}
    plan = rollback_plan(
        cur,
        2,
        1.0,
        1,
        anomaly_start=22,
        anomaly_end=22,
        checkpoint_step=20,
        checkpoint_path="/r/checkpoint-20",
        samples_by_step=samples,
        lr_scale=0.5,
        cause_event_seq=9,
        reason="loss_spike",
    )
    assert plan.skip_ranges == ((5, 8), (100, 101)) and plan.lr_scale == 0.5
    assert plan.resume_checkpoint == "/r/checkpoint-20" and plan.cause_event_seq == 9 and plan.revision == 2
    # The steps the samples came from travel with them, merged across rollbacks, for the dashboard to name.
    assert plan.skip_steps == ((21, 22),)
    again = rollback_plan(plan, 3, 2.0, 2, anomaly_start=30, anomaly_end=30, checkpoint_step=29,
                          checkpoint_path="/r/checkpoint-29", samples_by_step=samples, lr_scale=0.5,
                          cause_event_seq=12, reason="loss_spike")  # fmt: skip
    assert again.skip_steps == ((21, 22), (30, 30)) and again.skip_ranges == ((5, 8), (50, 50), (100, 101))
    assert "skipped 4 samples of steps 21..22" in plan.notes


def test_a_rollback_whose_samples_are_unknown_says_their_steps_are_trained_on_again() -> None:
    cur = PlanRevision(revision=1, ts=0, reason="start", lr_scale=1.0)
    plan = rollback_plan(cur, 2, 1.0, 1, anomaly_start=22, anomaly_end=23, checkpoint_step=20,
                         checkpoint_path="/o/checkpoint-20", samples_by_step={}, lr_scale=0.5,
                         cause_event_seq=9, reason="grad_explosion")  # fmt: skip
    assert plan.skip_ranges == () and plan.skip_steps == ()
    assert "samples of steps" not in plan.notes and "steps 21..23 is not skipped" in plan.notes, plan.notes


def test_oom_escalation_and_smaller_microbatch_keep_the_effective_batch() -> None:
    cur = PlanRevision(revision=0, ts=0, reason="start")
    change, _why = oom_escalation(cur, 512, gradient_checkpointing=False)
    assert change == {"gradient_checkpointing": True}
    gc = PlanRevision(revision=1, ts=0, reason="oom", gradient_checkpointing=True)
    assert oom_escalation(gc, 512, False)[0] == {"max_seq_length": 256}
    assert (
        oom_escalation(
            PlanRevision(revision=1, ts=0, reason="oom", gradient_checkpointing=True, max_seq_length=100),
            512,
            False,
        )
        is None
    )
    for b, a in ((8, 1), (6, 2), (3, 4)):
        new = smaller_microbatch(cur, b, a)
        assert new["per_device_train_batch_size"] * new["gradient_accumulation_steps"] == b * a
        assert new["per_device_train_batch_size"] < b
    assert smaller_microbatch(cur, 1, 4) is None


def test_safe_mode_fills_only_what_the_user_left_unset(tmp_path) -> None:
    from steadytune.config.load import load_config
    from steadytune.config.safe_mode import safe_mode

    (tmp_path / "m").mkdir()
    (tmp_path / "d.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "c.yaml").write_text(
        "model: {name_or_path: ./m}\ndata: {train_file: d.jsonl}\n"
        "train: {max_grad_norm: 0.5}\npolicy: {spike_confirm_points: 4}\n"
    )
    cfg = safe_mode(load_config(tmp_path / "c.yaml"))
    assert cfg.train.max_grad_norm == 0.5 and cfg.policy.spike_confirm_points == 4  # the user's choices stay
    assert cfg.policy.checkpoint_every_s == 600 and cfg.policy.max_lr == 5e-3  # the rest of the preset


def test_rl_troubles_a_restart_can_mend_roll_back_and_one_it_cannot_is_told() -> None:
    """A collapsed policy or a KL run away: the last good checkpoint at a lower LR (the "hard reset").
    No learning signal: a restart cannot fix a reward function, so the user is told, like a plateau."""
    pol = Policy()
    assert pol.on_raised(anomaly("reward_collapse", 40, metric="reward"), 42).name == "rollback"
    assert pol.on_raised(anomaly("kl_blowup", 60, metric="kl"), 60).name == "rollback"
    # None: the alert is the event itself, and no action follows.
    assert pol.on_raised(anomaly("no_learning_signal", 1, metric="frac_reward_zero_std"), 16) is None
    assert pol.config.rule("no_learning_signal").action == "alert"

"""RL / preference runs are judged on their own signals (detect/objective.py)."""

from __future__ import annotations

import math

import pytest

from steadytune.detect.synthetic import grpo_batches
from steadytune.objectives import is_preference_or_rl, is_rl, objective_of
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, raised, records, severe


@pytest.mark.parametrize(
    "keys, expected",
    [
        ({"rewards/chosen": 0.1, "rewards/margins": 0.3}, True),  # TRL DPO
        ({"reward": 0.5, "reward_std": 0.1, "kl": 0.01}, True),  # TRL GRPO
        ({"objective/kl": 2.0, "objective/scores": 1.0}, True),  # TRL PPO
        ({"logps/rejected": -120.0}, True),
        ({"train/acc_0": 0.5, "num-zeros": 0.0}, False),
        ({"grad_norm_clip": 1.0, "tokens_per_s": 1e4}, False),
        # A marker behind the prefix a script or logger puts before it.
        ({"eval_reward": 0.3}, True),
        ({"average_reward_score": 3.4}, True),  # DeepSpeed-Chat
        ({"kl_ref": 0.001, "actor_loss": 0.0}, True),
        ({"chosen_logps": -50.0}, True),
        ({"dpo_loss": 0.69, "aux_loss": 0.0}, True),  # a loss named after its objective
        # Not markers: fp16's scaler, an SFT evaluation's grade, an auxiliary loss.
        ({"loss_scale": 65536.0, "bleu_score": 0.3, "aux_loss": 0.01}, False),
    ],
)
def test_rl_and_preference_runs_are_known_by_their_fields(keys: dict, expected: bool) -> None:
    assert is_preference_or_rl(keys) is expected


def _grpo(n: int, seed: int, collapse_at: int | None = None, kl_jump_at: int | None = None):
    """A GRPO-like log: loss near zero (either sign), reward rising from 0.2 to 0.8, KL slowly growing."""
    rng = shapes.rng_for(seed, "grpo")
    losses, extra = [], []
    for i in range(n):
        reward = 0.2 + 0.6 * (1 - math.exp(-5 * i / n)) + rng.gauss(0, 0.03)
        if collapse_at is not None and i >= collapse_at:
            reward = 0.1 + rng.gauss(0, 0.03)
        kl = 0.001 + 0.02 * i / n
        kl *= math.exp(rng.gauss(0, 0.1))
        if kl_jump_at is not None and i >= kl_jump_at:
            kl *= 40.0
        losses.append(rng.gauss(0.0, 0.02) * (1 + i / n))
        extra.append({"reward": reward, "reward_std": 0.2, "kl": kl, "completion_length": 200.0})
    return losses, extra


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (60, 600))
def test_a_healthy_grpo_run_raises_nothing(n: int, seed: int) -> None:
    losses, extra = _grpo(n, seed)
    # The loss sits near zero and changes sign: read with the SFT rules it would be all spikes.
    assert severe(feed(records([abs(x) for x in losses], extra=extra))) == []
    assert severe(feed(records(losses, extra=extra))) == []


@pytest.mark.parametrize("seed", shapes.SEEDS)
def test_a_reward_that_gives_back_all_it_gained_collapsed(seed: int) -> None:
    losses, extra = _grpo(400, seed, collapse_at=300)
    got = raised(feed(records([abs(x) for x in losses], extra=extra)))
    assert [a.kind for a in got] == ["reward_collapse"]
    assert 300 <= got[0].start_step <= 300 + 12


@pytest.mark.parametrize("seed", shapes.SEEDS)
def test_a_kl_that_jumps_blew_up(seed: int) -> None:
    losses, extra = _grpo(400, seed, kl_jump_at=250)
    got = raised(feed(records([abs(x) for x in losses], extra=extra)))
    assert [a.kind for a in got] == ["kl_blowup"]
    assert got[0].start_step == 251


def test_a_nan_loss_is_still_caught_in_an_rl_run() -> None:
    losses, extra = _grpo(100, 0)
    losses[70] = float("nan")
    got = raised(feed(records([abs(x) for x in losses], extra=extra)))
    assert [(a.kind, a.start_step) for a in got] == [("nan_loss", 71)]


# The fields each TRL 1.16 trainer logs on its first step (their _metrics, and the HF Trainer's own).
_TRL_FIELDS = {
    "dpo": ["entropy", "num_tokens", "logits/chosen", "logits/rejected", "mean_token_accuracy",
            "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
            "logps/chosen", "logps/rejected"],
    "kto": ["entropy", "kl", "num_tokens", "logits/chosen", "logits/rejected", "logps/chosen",
            "logps/rejected", "rewards/chosen", "rewards/rejected", "rewards/margins"],
    "orpo": ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
             "logps/chosen", "logps/rejected", "nll_loss", "log_odds_ratio", "log_odds_chosen"],
    "grpo": ["num_tokens", "completions/mean_length", "rewards/brevity/mean", "rewards/brevity/std",
             "reward", "reward_std", "frac_reward_zero_std", "kl", "entropy", "clip_ratio/low_mean"],
    "ppo": ["objective/kl", "objective/entropy", "objective/scores", "policy/approxkl_avg"],
    "sft": ["entropy", "num_tokens", "mean_token_accuracy"],
}  # fmt: skip


@pytest.mark.parametrize(
    "trainer, expected",
    [("dpo", "preference (DPO)"), ("kto", "preference (KTO)"), ("orpo", "preference (ORPO)"),
     ("grpo", "RL (GRPO/RLOO)"), ("ppo", "RL (PPO)"), ("sft", None)],
)  # fmt: skip
def test_the_objective_is_named_after_the_trainer_its_fields_come_from(
    trainer: str, expected: str | None
) -> None:
    assert objective_of(dict.fromkeys(_TRL_FIELDS[trainer], 0.0)) == expected
    # verl's fields mark RL, but name no trainer of TRL's.
    assert objective_of({"actor/kl_loss": 0.01, "critic/score/mean": 0.3}) == "RL or preference"
    # ... until its actor's own fields name verl (a clip fraction or policy-gradient loss beside a reward).
    verl = {"actor/kl_loss": 0.01, "critic/score/mean": 0.3, "actor/pg_clipfrac": 0.002, "actor/pg_loss": 0.1}
    assert objective_of(verl) == "RL (verl)" and is_rl(objective_of(verl))
    assert objective_of({"actor/pg_loss": 0.1}) is None  # a policy loss alone marks no RL run
    # A loss named after its objective names it, where no trainer's fields do.
    assert objective_of({"dpo_loss": 0.69, "aux_loss": 0.0}) == "preference (DPO)"
    assert objective_of({"loss/orpo": 0.7}) == "preference (ORPO)"
    assert objective_of({"grpo_loss": 0.0, "reward": 0.3}) == "RL (GRPO/RLOO)"


def test_the_detector_says_what_it_judged_and_an_evaluation_does_not_decide_it() -> None:
    from steadytune.detect import LiveDetector
    from steadytune.objectives import LOSS_OBJECTIVE
    from steadytune.records import StepRecord

    det = LiveDetector()
    assert det.objective == LOSS_OBJECTIVE  # nothing seen: the loss rules
    det.observe_step(StepRecord(step=1, ts=0.0, eval_loss=0.7, extra={"eval": True, "eval_runtime": 1.0}))
    dpo = dict.fromkeys(_TRL_FIELDS["dpo"], 0.0)
    det.observe_step(StepRecord(step=1, ts=0.0, loss=0.69, extra=dpo))
    assert det.objective == "preference (DPO)"
    sft = LiveDetector()
    sft.observe_step(StepRecord(step=1, ts=0.0, loss=2.0, extra=dict.fromkeys(_TRL_FIELDS["sft"], 1.0)))
    assert sft.objective == LOSS_OBJECTIVE


def test_a_record_may_declare_its_objective_and_a_trainer_class_names_one() -> None:
    from steadytune.objectives import OBJECTIVE_KEY, objective_of_trainer

    # LLaMA-Factory's DPO trainer subclasses TRL's: the most derived known class names it.
    assert objective_of_trainer(["CustomDPOTrainer", "DPOTrainer", "Trainer", "object"]) == "preference (DPO)"
    assert objective_of_trainer(["GRPOTrainer", "Trainer"]) == "RL (GRPO/RLOO)"
    assert objective_of_trainer(["SFTTrainer", "Trainer", "object"]) is None
    # Declared beats the fields: the guard's first record has only its own (gradflow).
    assert objective_of({OBJECTIVE_KEY: "RL (GRPO/RLOO)", "gradflow": {}}) == "RL (GRPO/RLOO)"
    assert objective_of({"gradflow": {}}) is None


def _grpo_batches(
    n: int, seed: int, groups: int, beta: float, share_field: bool, storm_at: int | None = None
) -> tuple[list[float], list[float | None], list[dict]]:
    """A GRPO run batch by batch (synthetic.grpo_batches); from ``storm_at`` on, a gradient storm."""
    rng = shapes.rng_for(seed, f"grpo-batches-{groups}-{beta}")
    losses, grads, extra = grpo_batches(rng, n, groups, beta, share_field)
    if storm_at is not None:
        grads[storm_at:] = [30.0 * math.exp(rng.gauss(0, 0.3)) for _ in grads[storm_at:]]
    return losses, grads, extra


@pytest.mark.parametrize("share_field", (True, False))
@pytest.mark.parametrize("groups, beta", ((1, 0.0), (4, 0.04), (8, 0.001), (16, 0.04)))
@pytest.mark.parametrize("seed", range(6))
def test_grpo_batches_without_reward_signal_are_not_gradient_anomalies(
    seed: int, groups: int, beta: float, share_field: bool
) -> None:
    # With one prompt group per step, most batches tie early on: the norm drops to the KL term's (or
    # to 0) and comes back hundreds of times over. Judged as a series, each return is a spike and a
    # tied first batch makes every later norm an explosion over "the first norm".
    losses, grads, extra = _grpo_batches(400, seed, groups, beta, share_field)
    assert severe(feed(records(losses, grads, extra=extra))) == []


@pytest.mark.parametrize("early_outlier", (False, True))
@pytest.mark.parametrize("share_field", (True, False))
@pytest.mark.parametrize("seed", range(3))
def test_a_gradient_storm_in_a_grpo_run_is_still_an_explosion(
    seed: int, share_field: bool, early_outlier: bool
) -> None:
    losses, grads, extra = _grpo_batches(400, seed, 8, 0.04, share_field, storm_at=250)
    if early_outlier:
        # A fat-tailed batch while the level is still being found starts it again from there;
        # the batches after it must bring it back down, or every later norm is a "hole".
        grads[4] = 8.0  # about 30x a learning batch's norm, a quarter of the storm's
    got = raised(feed(records(losses, grads, extra=extra)))
    assert [a.kind for a in got if a.severity == "critical"][:1] == ["grad_explosion"]
    assert 251 <= got[0].start_step <= 251 + 3, [(a.kind, a.start_step) for a in got]


def test_which_rl_batches_carry_no_learning_signal() -> None:
    from steadytune.objectives import without_learning_signal

    assert without_learning_signal({"frac_reward_zero_std": 1.0, "reward_std": 0.4}, 0.01)
    assert without_learning_signal({"reward_std": 0.0}, 0.2)  # no spread in the whole batch
    assert without_learning_signal({}, 0.0)  # a zero norm: no advantages at beta 0
    # verl: the batch's advantages all zero.
    assert without_learning_signal({"critic/advantages/max": 0.0, "critic/advantages/min": 0.0}, 0.4)
    assert not without_learning_signal({"critic/advantages/max": 1.2, "critic/advantages/min": -0.9}, 0.4)
    assert not without_learning_signal({"critic/advantages/max": 0.0}, 0.4)  # half a range says nothing
    assert not without_learning_signal({"frac_reward_zero_std": 0.5, "reward_std": 0.2}, 0.01)
    assert not without_learning_signal(None, 0.3)

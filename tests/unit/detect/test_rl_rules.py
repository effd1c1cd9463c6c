"""Post-training rules on GENERATED RL and preference runs (detect/synthetic_rl.py): healthy ones over
length, group size, reward, beta and noise raise nothing; each trouble is found once, at its step.

The rules: no_learning_signal (detect/learning.py), reward_collapse (detect/reward.py), kl_blowup
(detect/kl.py), clip_saturation (detect/clip.py), nan_loss on the objective's own fields
(detect/objective.py); and a loss that goes negative is no cross-entropy to judge (detect/live.py).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest

from steadytune.detect import ALL_KINDS, DetectConfig, LiveDetector
from steadytune.detect.build import KINDS
from steadytune.detect.gradflow import FlowLimits, GradFlowWatch
from steadytune.detect.points import Signal
from steadytune.detect.stats import Tracker
from steadytune.detect.synthetic_rl import dpo_run, rl_run
from steadytune.objectives import SIGNED_OBJECTIVE, tied_share
from steadytune.records import Anomaly, StepRecord
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, final, records, severe

LENGTHS = (40, 300)
# (prompt groups per step, completions per group): one group of four on a small GPU, up to 16 x 16.
GROUPS = ((1, 4), (2, 8), (8, 8), (16, 16))
BETAS = (0.0, 0.04)
WINDOW = DetectConfig().rl.signal_window


def _grpo(n: int, seed: int, groups: tuple[int, int], beta: float, **kw: object) -> list[StepRecord]:
    rng = shapes.rng_for(seed, f"rl-{n}-{groups}-{beta}-{sorted(kw.items())}")
    losses, grads, extra = rl_run(rng, n, groups=groups[0], group_size=groups[1], beta=beta, **kw)  # type: ignore[arg-type]
    return records(losses, grads, extra=extra)


def _dpo(n: int, seed: int, batch: int, **kw: object) -> list[StepRecord]:
    rng = shapes.rng_for(seed, f"dpo-{n}-{batch}-{sorted(kw.items())}")
    losses, grads, lrs, extra = dpo_run(rng, n, batch=batch, **kw)  # type: ignore[arg-type]
    return records(losses, grads, lr=lrs, extra=extra)


def _severe(recs: list[StepRecord]) -> list[Anomaly]:
    return [t.anomaly for t in feed(recs) if t.state == "raised" and t.anomaly.severity != "info"]


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("groups", GROUPS)
@pytest.mark.parametrize(
    "beta, graded, share_field, on_policy",
    [(b, g, s, o) for b, g, s, o in itertools.product(BETAS, (False, True), (True, False), (True, False))],
)
def test_a_healthy_grpo_run_raises_nothing(
    n: int, seed: int, groups: tuple[int, int], beta: float, graded: bool, share_field: bool, on_policy: bool
) -> None:
    recs = _grpo(n, seed, groups, beta, graded=graded, share_field=share_field, on_policy=on_policy)
    assert severe(feed(recs)) == []


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (10, 20, 100, 600, 5000))
@pytest.mark.parametrize("batch", (2, 8, 64))
def test_a_healthy_dpo_run_raises_nothing(n: int, seed: int, batch: int) -> None:
    assert severe(feed(_dpo(n, seed, batch))) == []


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (20, 100, 600))
@pytest.mark.parametrize("batch", (2, 8, 64))
@pytest.mark.parametrize("beta", (0.05, 0.5))
def test_a_dpo_run_that_learns_the_wrong_way_is_told_once(n: int, seed: int, batch: int, beta: float) -> None:
    """Chosen and rejected swapped: margins below 0, the loss above ln 2 (detect/preference.py). Margins that
    never rose above their start (0) have no best to collapse from: no reward_collapse beside it."""
    got = _severe(_dpo(n, seed, batch, beta=beta, trouble="swapped"))
    assert [a.kind for a in got] == ["no_learning_signal"], [(a.kind, a.metric, a.start_step) for a in got]
    assert (got[0].metric, got[0].start_step) == ("loss", 1)
    assert got[0].evidence["loss_mean"] > math.log(2)
    if batch >= 8 and n >= 100:  # shorter or at two pairs a batch, the margins' sign is often not yet sure
        assert got[0].evidence["direction"] == "reversed"
        assert "prefer the rejected" in got[0].cause


@pytest.mark.parametrize("n", (40, 100, 600))
@pytest.mark.parametrize("trouble", ("swapped", "unlearned"))
def test_the_dpo_loss_rules_episode_lasts_the_run_and_gives_a_preference_fix(n: int, trouble: str) -> None:
    """Its episode ended where it was raised (`steps 1` on a 40-step run still above ln 2 at its end), and
    its advice was the RL rule's (completions, the reward function, num_generations)."""
    recs = _dpo(n, 3, 64, beta=0.1, trouble=trouble)
    got = [a for a in final(recs) if a.kind == "no_learning_signal"]
    assert [(a.start_step, a.end_step) for a in got] == [(1, recs[-1].step)]
    assert "chosen and rejected" in got[0].suggestion and "num_generations" not in got[0].suggestion


@pytest.mark.parametrize("seed", range(9))
@pytest.mark.parametrize("n", (20, 100, 600))
@pytest.mark.parametrize("batch", (2, 8, 64))
def test_swapped_dpo_labels_are_no_reward_collapse_nor_a_flat_reward(n: int, seed: int, batch: int) -> None:
    """More seeds than the test above, beta as TRL's default: a reward_collapse, or the whole-run rule's
    flat margins, beside the DPO loss rule's episode is a second episode for one trouble."""
    got = _severe(_dpo(n, seed + 100, batch, trouble="swapped"))
    assert [a for a in got if a.kind == "reward_collapse" or "whole_run" in a.evidence] == []
    assert "no_learning_signal" in [a.kind for a in got] or n == 20  # 20 pairs of two: often not yet sure


@pytest.mark.parametrize("trouble", ("swapped", "unlearned"))
@pytest.mark.parametrize("n", (100, 600))
@pytest.mark.parametrize("batch", (2, 8, 64))
def test_the_dpo_loss_rule_holds_its_one_episode(trouble: str, n: int, batch: int) -> None:
    """Its test is repeated as points come in and its figure wanders about the threshold: no clearing and
    raising again on the way (each beta, six seeds)."""
    for beta, seed in itertools.product((0.05, 0.1, 0.5), range(6)):
        out = feed(_dpo(n, seed, batch, beta=beta, trouble=trouble))
        raised = [t for t in out if t.state == "raised" and t.anomaly.kind == "no_learning_signal"]
        assert len(raised) <= 1, (beta, seed, [(t.anomaly.evidence.get("to_step")) for t in raised])


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (200, 600))
def test_dpo_margins_that_rose_and_fell_back_to_zero_are_a_reward_collapse(n: int, seed: int) -> None:
    """A best above the start (0): a fall from it to chance is a collapse, told once, near its step."""
    at = n // 2
    got = _severe(_dpo(n, seed, 64, trouble="collapse", at=at))
    collapse = [a for a in got if a.kind == "reward_collapse"]
    assert len(collapse) == 1, [(a.kind, a.metric, a.start_step) for a in got]
    assert collapse[0].metric == "rewards/margins"
    assert at + 1 <= collapse[0].start_step <= at + 8


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("batch", (8, 64))
def test_a_dpo_run_whose_margins_stay_around_zero_is_told_once(seed: int, batch: int) -> None:
    """The policy moves, its margins spread around 0: the loss settles above ln 2 while their mean does not
    rise. Long enough for the level to show (at 10-20 points of a small batch it is often hidden)."""
    got = [a for a in _severe(_dpo(300, seed, batch, trouble="unlearned")) if a.kind == "no_learning_signal"]
    assert len(got) == 1
    assert got[0].metric == "loss"
    assert got[0].evidence["loss_mean"] > math.log(2)


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("groups", GROUPS)
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("share_field", (True, False))
def test_a_reward_that_never_fires_is_one_episode_of_no_learning_signal_from_the_first_step(
    seed: int, groups: tuple[int, int], beta: float, share_field: bool
) -> None:
    got = _severe(_grpo(60, seed, groups, beta, share_field=share_field, trouble="dead"))
    assert [(a.kind, a.start_step) for a in got] == [("no_learning_signal", 1)]
    ev = got[0].evidence
    assert ev["to_step"] == WINDOW and ev["learning_share"] == 0.0  # raised once the window is full
    assert "reward function" in got[0].cause and "gradient norm was 0" in got[0].cause


def test_a_solved_task_whose_groups_all_tie_at_the_top_is_said_but_is_no_warning() -> None:
    """Every group earns the top reward: nothing is left to learn, and nothing is broken."""
    n, rewards = 60, []
    for i in range(n):
        rewards.append(min(1.0, 0.3 + 0.02 * i))
    extra = [{"reward": r, "reward_std": 0.0 if r == 1.0 else 0.3} for r in rewards]
    out = feed(records([0.0] * n, [0.0 if r == 1.0 else 0.4 for r in rewards], extra=extra))
    got = [t.anomaly for t in out if t.state == "raised"]
    assert [(a.kind, a.severity) for a in got] == [("no_learning_signal", "info")]
    assert got[0].evidence["saturated"] is True and "saturated" in got[0].cause


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (60, 300))
@pytest.mark.parametrize("groups", GROUPS)
@pytest.mark.parametrize("beta", BETAS)
def test_a_policy_that_collapses_is_a_reward_collapse_at_its_step(
    n: int, seed: int, groups: tuple[int, int], beta: float
) -> None:
    at = int(0.6 * n)
    got = _severe(_grpo(n, seed, groups, beta, trouble="collapse", at=at))
    collapse = [a for a in got if a.kind == "reward_collapse"]
    assert len(collapse) == 1, [(a.kind, a.start_step) for a in got]
    assert at + 1 <= collapse[0].start_step <= at + 3
    # The KL that jumped with it is the only other episode; the ties at the floor are the collapse's.
    assert {a.kind for a in got} <= {"reward_collapse", "kl_blowup"}


@pytest.mark.parametrize("seed", range(6))
def test_what_the_policy_collapsed_into_is_said(seed: int) -> None:
    got = _severe(_grpo(200, seed, (16, 16), 0.0, trouble="collapse", at=120))
    (collapse,) = [a for a in got if a.kind == "reward_collapse"]
    ev = collapse.evidence
    assert "entropy" in ev or "length" in ev, ev
    assert ("near-random" in collapse.cause) == ("entropy" in ev)
    assert ev["last_good_step"] <= 121 and ev["best_level"] > ev["value"] and "since_step" not in ev


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("groups", GROUPS)
def test_a_kl_that_runs_away_while_the_reward_does_not_improve_blew_up(
    seed: int, groups: tuple[int, int]
) -> None:
    """A hundredfold in about 27 steps, no step a tenth of that: no jump, a runaway."""
    at = 180
    got = _severe(_grpo(300, seed, groups, 0.04, trouble="kl_runaway", at=at))
    blowups = [a for a in got if a.kind == "kl_blowup"]
    assert blowups and at + 1 <= blowups[0].start_step <= at + 40, [(a.kind, a.start_step) for a in got]
    # The yardstick is a level (median of 8): set a few steps into the climb, it still stands for before it.
    assert blowups[0].evidence["ratio"] >= 100 and blowups[0].evidence["since_step"] <= at + 4


def test_a_kl_that_grows_as_the_reward_rises_is_the_policy_learning() -> None:
    n = 400
    extra = [
        {"reward": 0.1 + 0.8 * i / n, "kl": 1e-4 * math.exp(7 * i / n), "frac_reward_zero_std": 0.3}
        for i in range(n)
    ]  # the KL grows 1000x, the reward with it
    assert severe(feed(records([0.0] * n, [0.5] * n, extra=extra))) == []


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (60, 300))
def test_a_clip_ratio_that_saturates_is_said_once(seed: int, n: int) -> None:
    at = n // 2
    got = _severe(_grpo(n, seed, (8, 8), 0.04, on_policy=False, trouble="clip", at=at))
    assert [a.kind for a in got] == ["clip_saturation"]
    assert at + 1 <= got[0].start_step <= at + WINDOW // 2 + 1


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("trouble", ("dead", "frozen_lr0"))
def test_a_dpo_policy_that_never_moves_has_no_learning_signal(seed: int, trouble: str) -> None:
    """Frozen (no gradient) or at an LR of 0 (a gradient, no update): its margins stay exactly 0."""
    got = _severe(_dpo(100, seed, 8, trouble=trouble))
    assert [(a.kind, a.start_step) for a in got] == [("no_learning_signal", 1)]
    assert got[0].metric == ("grad_norm" if trouble == "dead" else "rewards/margins")
    assert ("LR was 0" in got[0].cause) == (trouble == "frozen_lr0")


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("batch", (2, 64))
def test_nan_in_a_dpo_runs_own_fields_is_one_episode_while_its_loss_is_finite(seed: int, batch: int) -> None:
    recs = _dpo(100, seed, batch, trouble="nan", at=60)
    assert all(math.isfinite(r.loss or 0.0) for r in recs)
    got = _severe(recs)
    assert [(a.kind, a.start_step, a.metric) for a in got] == [("nan_loss", 61, "rewards/margins")]
    assert set(got[0].evidence["fields"]) == {"rewards/margins", "rewards/chosen", "logps/chosen"}


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("merged", (True, False))
def test_nan_in_a_dpo_evaluation_is_one_episode_of_its_own(seed: int, merged: bool) -> None:
    """An evaluation whose loss and margins are NaN while training stays finite: the model's outputs on some
    eval pair. Merged into the step's record (``eval_`` fields, HF's trainer_state) or a record of its own;
    healthy evaluations before and after raise nothing."""
    recs = _dpo(100, seed, 8)
    for at, bad in ((80, False), (60, True), (40, False)):  # from the end: an inserted record shifts none
        ev = {"eval_rewards/margins": math.nan if bad else 0.5, "eval_rewards/chosen": -0.2}
        eval_loss = math.nan if bad else 0.6
        if merged:
            r = recs[at]
            recs[at] = StepRecord(
                step=r.step,
                ts=r.ts,
                loss=r.loss,
                grad_norm=r.grad_norm,
                lr=r.lr,
                eval_loss=eval_loss,
                extra={**(r.extra or {}), **ev},
            )
        else:
            fields = {k.removeprefix("eval_"): v for k, v in ev.items()} | {"eval": True}
            recs.insert(
                at + 1, StepRecord(step=recs[at].step, ts=recs[at].ts, eval_loss=eval_loss, extra=fields)
            )
    got = _severe(recs)
    assert [(a.kind, a.start_step, a.metric) for a in got] == [("nan_eval", 61, "eval_loss")]
    assert "in an evaluation" in (got[0].cause or "")


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (30, 300))
def test_an_sft_run_whose_gradient_is_exactly_zero_and_whose_loss_is_flat_updates_nothing(
    seed: int, n: int
) -> None:
    losses = shapes.flat(n, 2.0, 0.01, seed)
    got = severe(feed(records(losses, [0.0] * n)))
    assert [k for k, *_ in got][:1] == ["no_learning_signal"] and got[0][1] == 1


@pytest.mark.parametrize("seed", shapes.SEEDS)
def test_a_zero_norm_that_a_falling_loss_belies_is_a_placeholder(seed: int) -> None:
    """A pipeline engine logs 0.0 for a norm it does not compute; its loss says the model learns."""
    losses = shapes.learning(300, 2.0, 0.02, seed)
    assert severe(feed(records(losses, [0.0] * 300))) == []


def test_a_loss_that_goes_negative_is_no_cross_entropy_and_never_collapses() -> None:
    """On-policy distillation and policy-gradient losses sit below zero and flat by construction."""
    rng = shapes.rng_for(0, "signed")
    losses = [-0.03 + 0.015 * i / 200 + rng.gauss(0, 0.001) for i in range(200)]
    det = LiveDetector()
    out = [t for i, x in enumerate(losses, 1) for t in det.observe_step(StepRecord(i, float(i), loss=x))]
    assert det.objective == SIGNED_OBJECTIVE and [t.anomaly.kind for t in out] == []
    # A NaN is still a NaN.
    out = det.observe_step(StepRecord(201, 201.0, loss=math.nan))
    assert [t.anomaly.kind for t in out] == ["nan_loss"]


def test_which_batches_tied_and_how_many_groups() -> None:
    assert tied_share({"frac_reward_zero_std": 0.25, "reward_std": 0.3}) == 0.25
    assert tied_share({"reward_std": 0.0}) == 1.0  # TRL: the spread of the whole batch
    assert tied_share({"reward_std": 0.2}) is None  # spread across groups may still tie inside each
    assert tied_share({"critic/score/max": -1.0, "critic/score/min": -1.0}) == 1.0
    assert tied_share({"max_reward": 0.5, "min_reward": 0.1}) is None
    assert tied_share({"critic/advantages/max": 0.0, "critic/advantages/min": 0.0}) == 1.0
    assert tied_share(None) is None and tied_share({"reward": 0.3}) is None


DOCS = Path(__file__).resolve().parents[3] / "docs" / "detectors.md"


def _doc_row(kind: str) -> str:
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith(f"| `{kind}` |")]
    assert rows, f"docs/detectors.md has no row for {kind}"
    return rows[0]


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_every_kind_has_a_row_in_the_docs(kind: str) -> None:
    _doc_row(kind)


@pytest.mark.parametrize(
    "kind, recs",
    [
        ("no_learning_signal", lambda: _grpo(60, 0, (2, 8), 0.04, trouble="dead")),
        ("reward_collapse", lambda: _grpo(200, 0, (16, 16), 0.0, trouble="collapse", at=120)),
        ("kl_blowup", lambda: _grpo(300, 0, (8, 8), 0.04, trouble="kl_runaway", at=180)),
        ("clip_saturation", lambda: _grpo(60, 0, (8, 8), 0.04, on_policy=False, trouble="clip", at=30)),
    ],
)
def test_the_docs_name_each_post_training_kinds_evidence_and_its_advice(kind: str, recs: Any) -> None:
    """What a user reads in an alert is what the docs explain: every evidence key, and the advice."""
    (found,) = [a for a in _severe(recs()) if a.kind == kind]
    row = _doc_row(kind)
    assert [k for k in found.evidence if f"`{k}`" not in row] == []
    advice = row.rstrip(" |").rsplit("|", 1)[-1]
    assert KINDS[kind].suggestion.split(",")[0].split(" ")[0] in advice  # the advice's first verb
    assert found.suggestion == KINDS[kind].suggestion


def _flow(step: int, grad_norm: float, extra: dict[str, Any]) -> list[Any]:
    limits = FlowLimits(
        layer_vanish_norm=0.01, layer_explode_norm=10.0, layer_dead_zero_frac=0.5, zero_grad_norm=1e-8
    )
    layers = {f"layers.{i}": {"norm": 0.001 * (i + 1), "zero_frac": 0.0} for i in range(5)}
    out: list[Any] = []
    rec = StepRecord(step=step, ts=0.0, grad_norm=grad_norm, extra={"gradflow": layers, **extra})
    objective = "RL (GRPO/RLOO)" if "reward" in extra else None
    GradFlowWatch(limits).observe(Signal(rec, objective, False, Tracker(8, 64, 0.1, 1.0, 0.01)), out)
    return out


def test_a_step_without_a_gradient_is_not_a_vanishing_layer_per_layer() -> None:
    """The issue's zero-reward GRPO run: five grad_vanishing warnings at step 1, one per layer. A step whose
    norm is 0, or an RL batch whose groups all tied, is no_learning_signal's to judge over a window."""
    assert _flow(1, 0.0, {}) == []
    assert _flow(1, 0.004, {"reward": 0.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0}) == []
    # A model that does get a gradient, vanishing in every layer at once: one finding, not five.
    found = _flow(1, 0.004, {})
    assert [(f.kind, f.metric) for f in found] == [("grad_vanishing", "grad_norm/all layers")]
    assert found[0].evidence == {"layer": "all layers", "layers": 5, "largest_norm": 0.005}


@pytest.mark.parametrize("loss", (0.0, 1e-7))
def test_an_sft_run_whose_loss_collapsed_and_whose_gradient_is_zero_says_both(loss: float) -> None:
    """The issue's SFT run: grad norm exactly 0 at every log was told only as a loss collapse; that no
    update happens at all (every label masked, a loss without its graph) is the other half."""
    got = severe(feed(records([loss] * 30, [0.0] * 30)))
    assert [k for k, *_ in got] == ["loss_collapse", "no_learning_signal"]


def test_what_the_sft_rules_held_before_the_loss_went_negative_is_closed_when_it_does() -> None:
    """A policy-gradient loss logged without its fields: its first points, tiny and positive, read as a
    cross-entropy until it goes below zero; an episode they opened then ends there, not at the run's end."""
    losses = [1e-5] * 10 + [3e-4] * 6 + [-0.002 + 1e-4 * (i % 3) for i in range(40)]
    out = feed(records(losses, [0.5] * len(losses)))
    first_negative = 17
    raised = {(t.anomaly.kind, t.anomaly.metric) for t in out if t.state == "raised"}
    ended = {(t.anomaly.kind, t.anomaly.metric): t.anomaly.end_step for t in out if t.state == "resolved"}
    assert raised and set(ended) == raised, (raised, ended)
    assert all(step <= first_negative for step in ended.values()), ended


def test_a_kl_that_climbs_a_hundredfold_from_almost_nothing_has_run_nowhere() -> None:
    """From 2e-6 to 2e-3 while a noisy reward rises too slowly to make a new best by two sigmas."""
    rng = shapes.rng_for(0, "kl-small")
    n = 200
    extra = [
        {
            "reward": float(rng.random() < 0.35 + 0.1 * i / n),
            "kl": 2e-6 * math.exp(7 * min(i, 60) / 60) * math.exp(rng.gauss(0, 0.2)),
            "frac_reward_zero_std": 0.3,
        }
        for i in range(n)
    ]
    got = [a for a in _severe(records([0.0] * n, [0.5] * n, extra=extra)) if a.kind == "kl_blowup"]
    assert got == []
    # The same climb, a thousand times higher (per sequence, or a policy run off): a runaway.
    for e in extra:
        e["kl"] *= 1000
    got = [a for a in _severe(records([0.0] * n, [0.5] * n, extra=extra)) if a.kind == "kl_blowup"]
    assert [a.evidence["reason"] for a in got] == ["the KL ran away while the reward did not improve"]

"""Per-layer LoRA ranks and per-group LRs on a real HF Trainer + PEFT run of the demo model.

The optimizer's own ``param_groups`` are read at every step: each configured group trains
at its planned LR, and after a rollback plan (resume from a checkpoint at a lower LR)
every group is lowered, not only the first, although the checkpoint's optimizer and
scheduler state still hold the old LRs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import TrainerCallback

from steadytune.config.load import validate_dict
from steadytune.config.schema import SteadytuneConfig
from steadytune.estimate import TrainSetup, load_architecture
from steadytune.estimate.states import param_counts
from steadytune.guard.checkpoints import CheckpointKeeper
from steadytune.guard.core import Guard
from steadytune.guard.hf import GuardCallback
from steadytune.policy.plan import rollback_plan
from steadytune.records import PlanRevision, StepRecord
from steadytune.rundir import RunDir
from steadytune.supervise.restarts import first_plan
from steadytune.telemetry.stream import iter_records
from steadytune.train.runner import build_trainer

LR = 1e-3


class GroupLrs(TrainerCallback):
    """Each optimizer group's (name, lr, initial lr) after every step, as the optimizer holds them."""

    def __init__(self) -> None:
        self.steps: dict[int, list[tuple[str, float, float]]] = {}
        self.model: Any = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.model = kw["model"]
        self.steps[state.global_step] = [
            (g.get("name", ""), g["lr"], g["initial_lr"]) for g in kw["optimizer"].param_groups
        ]


def config(tmp_path: Path, assets: Path, **train: Any) -> SteadytuneConfig:
    return validate_dict(
        {
            "model": {"name_or_path": str(assets / "model")},
            "method": "lora",
            "lora": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "rank_pattern": {"o_proj": 2}},
            "data": {"train_file": str(assets / "train.jsonl"), "max_seq_length": 48, "max_samples": 32},
            "train": {
                "per_device_train_batch_size": 4,
                "max_steps": 4,
                "save_steps": 2,
                "logging_steps": 1,
                "learning_rate": LR,
                "lr_scheduler_type": "constant",  # the LR a group holds is its planned LR at every step
                "weight_decay": 0.01,
                "use_cpu": True,
                **train,
            },
            "run": {"runs_dir": str(tmp_path)},
        },
        base=tmp_path,
    )


def train(
    cfg: SteadytuneConfig, run: RunDir, plan: PlanRevision, resume: str | None = None
) -> tuple[GroupLrs, Guard]:
    guard = Guard(run.root, rank=0, attempt=plan.attempt)
    keeper = CheckpointKeeper(run, min_free_bytes=0)
    probe = GroupLrs()
    trainer = build_trainer(cfg, plan, guard, [GuardCallback(guard, keeper, run.staging), probe], run.staging)
    trainer.train(resume_from_checkpoint=resume)
    guard.close()
    return probe, guard


def by_name(rows: list[tuple[str, float, float]]) -> dict[str, float]:
    """One LR per group name (a group is split in two by weight decay; both halves share the LR)."""
    out: dict[str, set[float]] = {}
    for name, lr, _ in rows:
        out.setdefault(name, set()).add(lr)
    assert all(len(v) == 1 for v in out.values()), out
    return {k: v.pop() for k, v in out.items()}


def test_two_groups_train_at_their_lrs_and_a_rollback_lowers_both(tmp_path: Path, demo_assets: Path) -> None:
    groups = [
        {"match": r"self_attn", "lr_scale": 2.0, "name": "attn"},
        {"match": r"\.mlp\.", "lr_scale": 0.25, "name": "mlp"},
    ]
    cfg = config(tmp_path, demo_assets, lr_groups=groups)
    run = RunDir(tmp_path / "run")
    plan0 = first_plan(cfg, 0.0)
    assert dict(plan0.lr_groups) == {"default": LR, "attn": 2 * LR, "mlp": 0.25 * LR}

    first, _ = train(cfg, run, plan0)
    assert sorted(first.steps) == [1, 2, 3, 4]
    for rows in first.steps.values():
        # all-linear LoRA puts every trainable parameter in attention or MLP: no default group.
        assert by_name(rows) == {"attn": pytest.approx(2 * LR), "mlp": pytest.approx(0.25 * LR)}
    # Per-layer rank: o_proj's adapters have rank 2, the others the default 4.
    shapes = {n: tuple(p.shape) for n, p in first.model.named_parameters() if "lora_A" in n}
    assert {s for n, s in shapes.items() if "o_proj" in n} == {(2, 128)}
    assert {s[0] for n, s in shapes.items() if "o_proj" not in n} == {4}
    # The estimator counts the same adapter from the shapes alone.
    setup = TrainSetup(
        method="lora", lora_r=4, target_modules=("all-linear",), lora_rank_pattern=(("o_proj", 2),)
    )
    trainable = sum(p.numel() for p in first.model.parameters() if p.requires_grad)
    assert param_counts(load_architecture(demo_assets / "model"), setup).adapter == trainable

    checkpoint = run.checkpoints / "checkpoint-2"
    assert checkpoint.is_dir()
    plan1 = rollback_plan(plan0, 1, 1.0, 1, 3, 4, 2, str(checkpoint), {}, 0.5, None, "loss_spike")
    assert dict(plan1.lr_groups) == {"default": LR / 2, "attn": LR, "mlp": LR / 8}

    second, guard = train(cfg, run, plan1, resume=str(checkpoint))
    assert sorted(second.steps) == [3, 4]  # resumed after step 2
    for rows in second.steps.values():
        assert by_name(rows) == {"attn": pytest.approx(LR), "mlp": pytest.approx(LR / 8)}
        assert {name: start for name, _, start in rows} == {
            "attn": pytest.approx(LR),
            "mlp": pytest.approx(LR / 8),
        }
    # The step records carry the run's base LR (the default group's), halved by the rollback.
    lrs = {
        r.attempt: r.lr
        for r in iter_records(guard.run.telemetry(0))
        if isinstance(r, StepRecord) and not r.extra.get("eval")
    }
    assert lrs == {0: pytest.approx(LR), 1: pytest.approx(LR / 2)}


def test_loraplus_and_layer_decay_scale_each_layer_and_b_matrix(tmp_path: Path, demo_assets: Path) -> None:
    cfg = config(tmp_path, demo_assets, max_steps=1, save_steps=1, loraplus_lr_ratio=16, layer_decay=0.5)
    probe, _ = train(cfg, RunDir(tmp_path / "run"), first_plan(cfg, 0.0))
    # Two decoder layers: the top one (1) at the full LR, layer 0 at x0.5; B matrices x16 on top.
    assert by_name(probe.steps[1]) == {
        "default@layers.0": pytest.approx(0.5 * LR),
        "default.lora_B@layers.0": pytest.approx(8 * LR),
        "default@layers.1": pytest.approx(LR),
        "default.lora_B@layers.1": pytest.approx(16 * LR),
    }
    b_params = {n for n, p in probe.model.named_parameters() if p.requires_grad and ".lora_B." in n}
    assert len(b_params) == 2 * 7  # every all-linear projection of both layers


def test_a_rollback_lowers_the_lr_of_a_single_group_run_too(tmp_path: Path, demo_assets: Path) -> None:
    """Without lr_groups the plan's lr_scale must survive the resume as well (it used not to)."""
    cfg = config(tmp_path, demo_assets)
    run = RunDir(tmp_path / "run")
    plan0 = first_plan(cfg, 0.0)
    assert plan0.lr_groups == ()
    train(cfg, run, plan0)
    checkpoint = run.checkpoints / "checkpoint-2"
    plan1 = rollback_plan(plan0, 1, 1.0, 1, 3, 4, 2, str(checkpoint), {}, 0.5, None, "loss_spike")
    second, _ = train(cfg, run, plan1, resume=str(checkpoint))
    assert [lr for rows in second.steps.values() for _, lr, _ in rows] == pytest.approx([LR / 2] * 4)


# The short sleep per step lets the supervisor act on the spike long before the run's end, even under load.
BURST = {"lr_burst_at_step": 21, "lr_burst_factor": 1000.0, "step_sleep_s": 0.1}


@pytest.mark.slow
def test_a_supervised_spike_rollback_halves_every_group(tmp_path: Path, demo_assets: Path) -> None:
    """`steadytune run` end to end: an LR burst spikes the gradients, the supervisor rolls back, and the
    restarted worker's optimizer holds every group at half its LR, as the plan revision records."""
    from steadytune.records import from_json
    from steadytune.telemetry.events import read_events

    from .runs import finish, run_dir, start_run, write_config

    cfg = write_config(
        tmp_path,
        demo_assets,
        # A full fine-tune, as in test_rollback_skip: its LR burst spikes reliably (a LoRA adapter's
        # response to one varies from run to run); the grouped LoRA runs are the tests above.
        train={
            "learning_rate": 3e-3,
            "max_steps": 40,
            "max_grad_norm": 0.0,
            "lr_scheduler_type": "constant",
            "warmup_steps": 0,
            "lr_groups": [
                {"match": "self_attn", "lr_scale": 2.0, "name": "attn"},
                {"match": r"\.mlp\.", "lr_scale": 0.5, "name": "mlp"},
            ],
        },
        policy={"spike_confirm_points": 1},
    )
    rc, out = finish(start_run(cfg, "groups", faults=BURST))
    assert rc == 0, out
    run = run_dir(cfg, "groups")
    plans = [from_json(line) for line in run.plan.read_text().splitlines() if line.strip()]
    assert dict(plans[0].lr_groups) == pytest.approx({"default": 3e-3, "attn": 6e-3, "mlp": 1.5e-3})
    rollback = next(p for p in plans if p.skip_ranges)
    assert rollback.lr_scale == 0.5
    assert dict(rollback.lr_groups) == pytest.approx({"default": 1.5e-3, "attn": 3e-3, "mlp": 7.5e-4})
    reported = {
        e.data["attempt"]: e.data["groups"] for e in read_events(run.events) if e.name == "optimizer_groups"
    }
    # Embeddings, norms and the head match neither entry: they train in the default group.
    assert reported[0] == pytest.approx({"default": 3e-3, "attn": 6e-3, "mlp": 1.5e-3})
    assert reported[rollback.attempt] == pytest.approx({"default": 1.5e-3, "attn": 3e-3, "mlp": 7.5e-4})

"""Config lints: each likely mistake is named with the value and the fix; sane configs pass."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from steadytune.estimate import Architecture
from steadytune.preflight.lints import config_lints, total_steps
from steadytune.preflight.result import Check

from .conftest import DEMO, make_config

# A 7B-class shape, as wide as the models the usual learning-rate ranges come from.
WIDE = replace(DEMO, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=11008)


def named(found, name):
    (check,) = [c for c in found if c.name == name]
    return check


def test_a_sane_lora_config_has_no_warnings(tmp_path: Path) -> None:
    found = config_lints(make_config(tmp_path), DEMO, samples=1000, fits_micro_batch=4)
    assert [c for c in found if c.status != "ok"] == []


def test_learning_rate_far_from_the_usual_range(tmp_path: Path) -> None:
    high = named(config_lints(make_config(tmp_path, train={"learning_rate": 1.0}), WIDE), "learning_rate")
    assert high.status == "warn" and "learning_rate=1" in high.reason and "1e-4 to 5e-4" in high.fix
    low = named(config_lints(make_config(tmp_path, train={"learning_rate": 1e-8}), WIDE), "learning_rate")
    assert low.status == "warn" and "barely move" in low.reason
    full = named(
        config_lints(make_config(tmp_path, method="full", train={"learning_rate": 5e-3}), WIDE),
        "learning_rate",
    )
    assert full.status == "warn" and "full" in full.reason


def test_a_narrow_model_takes_a_proportionally_higher_learning_rate(tmp_path: Path) -> None:
    """The demo's full fine-tune at 2e-3 is in range at its hidden size of 128 (8x the usual), the
    same LR is not on a 4096-wide model, and 10x the narrow range's top still warns."""

    def lint(lr: float, arch: Architecture) -> Check:
        return named(config_lints(make_config(tmp_path, method="full", train={"learning_rate": lr}), arch),
                     "learning_rate")  # fmt: skip

    demo = lint(2e-3, DEMO)
    assert demo.status == "ok" and "8e-05 to 0.0008 at hidden size 128" in demo.reason
    assert lint(2e-3, WIDE).status == "warn"
    far = lint(1e-2, DEMO)
    assert far.status == "warn" and "far above" in far.reason and "at hidden size 128" in far.fix
    assert lint(5e-7, DEMO).status == "warn"  # 100x below the narrow range's bottom (8e-5)


def test_lora_rank_and_alpha(tmp_path: Path) -> None:
    found = config_lints(make_config(tmp_path, lora={"r": 512, "lora_alpha": 1}), DEMO)
    alpha, rank = named(found, "lora_alpha"), named(found, "lora_r")
    assert alpha.status == "warn" and "1/512" in alpha.reason and "512 or 1024" in alpha.fix
    assert rank.status == "warn" and "r=512" in rank.reason and "hidden size 128" in rank.reason
    drop = config_lints(make_config(tmp_path, lora={"lora_dropout": 0.5}), DEMO)
    assert named(drop, "lora_dropout").status == "warn"
    assert not [
        c for c in config_lints(make_config(tmp_path, method="full"), DEMO) if c.name.startswith("lora")
    ]


def test_sequence_beyond_max_position_embeddings(tmp_path: Path) -> None:
    found = named(config_lints(make_config(tmp_path, data={"max_seq_length": 512}), DEMO), "max_seq_length")
    assert found.status == "warn" and "max_position_embeddings=256" in found.reason and "256" in found.fix


def test_save_steps_against_the_run_length(tmp_path: Path) -> None:
    late = named(
        config_lints(make_config(tmp_path, train={"max_steps": 10, "save_steps": 50}), DEMO), "save_steps"
    )
    assert late.status == "fail" and "no checkpoint before the end" in late.reason
    many = named(
        config_lints(make_config(tmp_path, train={"max_steps": 10_000, "save_steps": 5}), DEMO), "save_steps"
    )
    assert many.status == "warn" and "2000 checkpoints" in many.reason
    # Epoch-based runs: the length comes from the dataset size.
    cfg = make_config(
        tmp_path,
        train={
            "max_steps": -1,
            "num_train_epochs": 2,
            "save_steps": 100,
            "per_device_train_batch_size": 8,
            "gradient_accumulation_steps": 2,
        },
    )
    assert total_steps(cfg, samples=480) == 60
    assert named(config_lints(cfg, DEMO, samples=480), "save_steps").status == "fail"
    assert named(config_lints(cfg, DEMO, samples=None), "save_steps").status == "ok"


def test_gradient_accumulation_against_batch(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, train={"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8})
    bigger = named(config_lints(cfg, DEMO, samples=1000, fits_micro_batch=8), "batch")
    assert (
        bigger.status == "warn"
        and "per_device_train_batch_size: 8, gradient_accumulation_steps: 2" in bigger.fix
    )
    whole = named(config_lints(cfg, DEMO, samples=10), "batch")
    assert whole.status == "warn" and "whole dataset" in whole.reason
    auto = make_config(tmp_path, train={"per_device_train_batch_size": "auto", "auto_effective_batch": 32})
    assert "auto" in named(config_lints(auto, DEMO), "batch").reason


def test_clipping_off_and_warmup_past_the_end(tmp_path: Path) -> None:
    found = config_lints(make_config(tmp_path, train={"max_grad_norm": 0.0, "warmup_steps": 200}), DEMO)
    assert named(found, "max_grad_norm").status == "warn"
    assert named(found, "warmup_steps").status == "warn"


def test_a_rank_beyond_a_matrix_dimension_and_a_key_that_adapts_nothing(tmp_path: Path) -> None:
    # The demo's k_proj maps 128 -> 64: a rank of 100 cannot be reached by its update.
    cfg = make_config(tmp_path, lora={"r": 8, "rank_pattern": {"k_proj": 100, "qproj": 4}})
    found = config_lints(cfg, DEMO, samples=5000)
    rank = named(found, "lora_rank_pattern")
    assert rank.status == "warn" and "rank 100 on k_proj (2 modules)" in rank.reason
    assert "smaller dimension 64" in rank.reason and "64 or less" in rank.fix
    dead = named(found, "lora_rank_pattern_unused")
    assert dead.status == "warn" and "'qproj' matches no adapted module: it has no effect" in dead.reason
    shadowed = config_lints(make_config(tmp_path, lora={"rank_pattern": {"proj": 4, "q_proj": 2}}), DEMO)
    assert "matches no adapted module" in named(shadowed, "lora_rank_pattern_unused").reason
    first = config_lints(make_config(tmp_path, lora={"rank_pattern": {".*_proj": 4, "q_proj": 2}}), DEMO)
    assert (
        "an earlier key already sets (the first key wins)" in named(first, "lora_rank_pattern_unused").reason
    )


def test_lr_groups_that_match_nothing_or_overlap(tmp_path: Path) -> None:
    groups = [
        {"match": "self_attn", "lr_scale": 2, "name": "attn"},
        {"match": "q_proj", "lr_scale": 5, "name": "q"},
        {"match": "mlpp", "lr_scale": 0.5},
    ]
    found = config_lints(make_config(tmp_path, train={"lr_groups": groups}), DEMO, samples=5000)
    none = named(found, "lr_groups")
    assert (
        none.status == "warn" and "'mlpp'" in none.reason and "matches no trainable parameter" in none.reason
    )
    both = named(found, "lr_groups_overlap")
    # q_proj's A and B in both layers: 4 parameters, won by the first listed group.
    assert both.status == "warn" and "both match 4 parameters" in both.reason
    assert "the first listed, 'attn' (x2), wins them" in both.reason and "list the more specific" in both.fix
    clean = config_lints(make_config(tmp_path, train={"lr_groups": groups[:1]}), DEMO, samples=5000)
    assert named(clean, "lr_groups").status == "ok"


def test_weight_decay_zero_on_a_full_fine_tune(tmp_path: Path) -> None:
    found = named(config_lints(make_config(tmp_path, method="full"), DEMO, samples=5000), "weight_decay")
    assert found.status == "warn" and "full fine-tune" in found.reason and "weight_decay: 0.01" in found.fix
    decayed = make_config(tmp_path, method="full", train={"weight_decay": 0.01})
    assert [c for c in config_lints(decayed, DEMO, samples=5000) if c.name == "weight_decay"] == []
    assert [
        c for c in config_lints(make_config(tmp_path), DEMO, samples=5000) if c.name == "weight_decay"
    ] == []


def test_no_dropout_and_a_high_rank_on_a_small_dataset(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, lora={"r": 64, "lora_alpha": 128, "lora_dropout": 0.0})
    found = config_lints(cfg, DEMO, samples=200)
    drop = named(found, "lora_dropout_small_data")
    assert (
        drop.status == "warn" and "200 training samples" in drop.reason and "lora_dropout: 0.05" in drop.fix
    )
    high = named(found, "lora_r_small_data")
    # all-linear on the demo: 2 layers x r 64 x (in + out summed over q,k,v,o,gate,up,down = 2048).
    assert high.status == "warn" and "r=64 on a small dataset of 200 samples" in high.reason
    assert "262,144 adapter parameters, 1,310 per sample" in high.reason and "overfitting" in high.reason
    # The same config on enough data, or with unknown data size, raises neither.
    for samples in (1000, None):
        names = {c.name for c in config_lints(cfg, DEMO, samples=samples)}
        assert not names & {"lora_dropout_small_data", "lora_r_small_data"}

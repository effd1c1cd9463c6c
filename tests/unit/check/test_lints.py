"""Config lints: each likely mistake is named with the value and the fix; sane configs pass."""

from __future__ import annotations

from pathlib import Path

from steadytune.preflight.lints import config_lints, total_steps

from .conftest import DEMO, make_config


def named(found, name):
    (check,) = [c for c in found if c.name == name]
    return check


def test_a_sane_lora_config_has_no_warnings(tmp_path: Path) -> None:
    found = config_lints(make_config(tmp_path), DEMO, samples=1000, fits_micro_batch=4)
    assert [c for c in found if c.status != "ok"] == []


def test_learning_rate_far_from_the_usual_range(tmp_path: Path) -> None:
    high = named(config_lints(make_config(tmp_path, train={"learning_rate": 1.0}), DEMO), "learning_rate")
    assert high.status == "warn" and "learning_rate=1" in high.reason and "1e-4 to 5e-4" in high.fix
    low = named(config_lints(make_config(tmp_path, train={"learning_rate": 1e-8}), DEMO), "learning_rate")
    assert low.status == "warn" and "barely move" in low.reason
    full = named(
        config_lints(make_config(tmp_path, method="full", train={"learning_rate": 5e-3}), DEMO),
        "learning_rate",
    )
    assert full.status == "warn" and "full" in full.reason


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

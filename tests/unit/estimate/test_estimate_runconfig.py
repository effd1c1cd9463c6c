"""Reading the memory-relevant keys of a run config, leniently, all errors at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from steadytune.estimate import SetupError, TrainSetup, load_run_config, setup_from_config_dict

CONFIG = {
    "model": {
        "name_or_path": "examples/models/llama-3.1-8b",
        "dtype": "bfloat16",
        "trust_remote_code": False,
    },
    "method": "lora",
    "lora": {"r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    "data": {"max_seq_length": 4096, "path": "train.jsonl"},
    "train": {
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 8,
        "gradient_checkpointing": True,
        "bf16": True,
        "optim": "paged_adamw_8bit",
        "learning_rate": 2e-4,
    },
    "alerts": {"webhook": "https://example.invalid"},
}


def test_maps_every_key_it_needs() -> None:
    path, setup = setup_from_config_dict(CONFIG)
    assert path == "examples/models/llama-3.1-8b"
    assert setup == TrainSetup(
        method="lora",
        lora_r=16,
        target_modules=("q_proj", "k_proj", "v_proj", "o_proj"),
        dtype="bf16",
        mixed_precision=True,
        weights_dtype="bf16",
        optimizer="adamw8bit",
        batch=2,
        seq=4096,
        gradient_accumulation_steps=8,
        gradient_checkpointing=True,
    )


def test_overrides_win_and_none_means_keep() -> None:
    _, setup = setup_from_config_dict(CONFIG, batch=1, seq=None, method="qlora")
    assert (setup.batch, setup.seq, setup.method) == (1, 4096, "qlora")


def test_model_dtype_without_amp_is_pure_precision() -> None:
    _, setup = setup_from_config_dict({"model": {"dtype": "bfloat16"}, "method": "full"})
    assert (setup.dtype, setup.mixed_precision) == ("bf16", False)
    _, setup = setup_from_config_dict({"train": {"bf16": False, "fp16": False}, "method": "full"})
    assert (setup.dtype, setup.mixed_precision) == ("fp32", False)


def test_empty_config_gives_defaults() -> None:
    assert setup_from_config_dict({}) == (None, TrainSetup())


def test_all_problems_at_once() -> None:
    bad = {"model": {"dtype": "int2", "attn_implementation": "ring"}, "train": {"optim": "lion"}}
    with pytest.raises(SetupError) as info:
        setup_from_config_dict(bad)
    message = str(info.value)
    assert "int2" in message and "ring" in message and "lion" in message


def test_load_run_config(tmp_path: Path) -> None:
    good = tmp_path / "run.yaml"
    good.write_text("method: qlora\ntrain:\n  per_device_train_batch_size: 4\n")
    assert load_run_config(good) == {"method": "qlora", "train": {"per_device_train_batch_size": 4}}
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(SetupError, match="mapping"):
        load_run_config(listing)
    with pytest.raises(SetupError, match="does not exist"):
        load_run_config(tmp_path / "missing.yaml")

"""Reading config.json into an Architecture and counting parameters exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.estimate import Architecture, ArchitectureError, architecture_from_dict, load_architecture
from tests.unit.estimate.conftest import MODELS


@pytest.mark.parametrize(
    ("model", "params"),
    [("llama-3.1-8b", 8_030_261_248), ("llama-3.2-3b", 3_212_749_824), ("llama-2-7b", 6_738_415_616)],
)
def test_published_param_counts(model: str, params: int) -> None:
    # The totals HF reports for these checkpoints (8.03B, 3.21B, 6.74B), exactly.
    assert load_architecture(MODELS / model).total_params == params


def test_example_configs_carry_the_published_shapes() -> None:
    eight = json.loads((MODELS / "llama-3.1-8b" / "config.json").read_text())
    three = json.loads((MODELS / "llama-3.2-3b" / "config.json").read_text())
    assert (eight["hidden_size"], eight["num_hidden_layers"], eight["num_attention_heads"]) == (4096, 32, 32)
    assert (eight["num_key_value_heads"], eight["intermediate_size"], eight["vocab_size"]) == (
        8,
        14336,
        128256,
    )
    assert eight["rope_scaling"]["rope_type"] == "llama3" and eight["max_position_embeddings"] == 131072
    assert (three["hidden_size"], three["num_hidden_layers"], three["num_attention_heads"]) == (3072, 28, 24)
    assert (three["num_key_value_heads"], three["intermediate_size"], three["vocab_size"]) == (
        8,
        8192,
        128256,
    )
    assert three["tie_word_embeddings"] is True and three["rope_scaling"]["factor"] == 32.0


def test_tied_embeddings_count_once(llama3b: Architecture) -> None:
    assert llama3b.tie_word_embeddings
    assert llama3b.lm_head_params == 0
    untied = Architecture(**{**llama3b.__dict__, "tie_word_embeddings": False})
    assert untied.total_params - llama3b.total_params == llama3b.vocab_size * llama3b.hidden_size


def test_qwen2_has_qkv_bias_without_saying_so() -> None:
    arch = architecture_from_dict(
        {
            "model_type": "qwen2",
            "hidden_size": 896,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "intermediate_size": 4864,
            "vocab_size": 151936,
            "tie_word_embeddings": True,
        }
    )
    biases = {lin.name: lin.bias for lin in arch.linears()}
    assert biases["q_proj"] and biases["k_proj"] and biases["v_proj"]
    assert not biases["o_proj"]
    # Qwen2.5-0.5B: 494,032,768 parameters.
    assert arch.total_params == 494_032_768


def test_text_config_is_unwrapped() -> None:
    inner = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
    }
    arch = architecture_from_dict({"model_type": "llava", "text_config": inner})
    assert arch.hidden_size == 64 and arch.num_layers == 2
    assert arch.num_kv_heads == 4 and arch.head_dim == 16  # defaults from heads


def test_every_missing_key_is_reported_at_once() -> None:
    with pytest.raises(ArchitectureError) as info:
        architecture_from_dict({"model_type": "llama", "hidden_size": 64})
    message = str(info.value)
    for key in ("num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        assert key in message


def test_mixture_of_experts_is_refused_with_a_reason() -> None:
    config = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
        "num_local_experts": 8,
    }
    with pytest.raises(ArchitectureError, match="mixture-of-experts"):
        architecture_from_dict(config)


def test_load_accepts_a_directory_or_the_file(tmp_path: Path) -> None:
    config = MODELS / "llama-3.1-8b" / "config.json"
    assert load_architecture(config) == load_architecture(config.parent)


def test_load_errors_say_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ArchitectureError, match=r"no config\.json"):
        load_architecture(tmp_path / "nowhere")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ArchitectureError, match="as JSON"):
        load_architecture(bad)

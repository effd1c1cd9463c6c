"""Parameter names grouped into layers, in forward order, across model families and wrappers."""

from __future__ import annotations

import pytest

from steadytune.layers import forward_order, layer_of


@pytest.mark.parametrize(
    "name, layer",
    [
        ("model.embed_tokens.weight", "embeddings"),
        ("model.layers.3.self_attn.q_proj.weight", "layers.3"),
        ("base_model.model.model.layers.3.mlp.down_proj.lora_B.weight", "layers.3"),  # PEFT
        ("module._orig_mod.model.layers.7.input_layernorm.weight", "layers.7"),  # DDP + compile
        ("transformer.h.2.attn.c_attn.weight", "layers.2"),  # GPT-2
        ("gpt_neox.layers.4.attention.dense.weight", "layers.4"),  # Pythia
        ("transformer.wte.weight", "embeddings"),
        ("model.norm.weight", "final_norm"),
        ("transformer.ln_f.bias", "final_norm"),
        ("lm_head.weight", "lm_head"),
        ("embed_out.weight", "lm_head"),
    ],
)
def test_layer_of(name: str, layer: str) -> None:
    assert layer_of(name)[0] == layer


def test_forward_order_sorts_blocks_numerically() -> None:
    names = [
        "lm_head.weight",
        "model.layers.10.mlp.w",
        "model.norm.weight",
        "model.layers.2.mlp.w",
        "model.embed_tokens.weight",
        "model.layers.2.attn.w",
        "model.rotary.inv_freq",
    ]
    assert forward_order(names) == ["embeddings", "layers.2", "layers.10", "rotary", "final_norm", "lm_head"]

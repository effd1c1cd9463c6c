"""diff-ckpt statistics and the problem-layer verdict, on small synthetic checkpoints."""

from __future__ import annotations

import math

import numpy as np
from safetensors.numpy import save_file

from steadytune.forensics.ckptdiff import diff_checkpoints

LAYERS = 6


def model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = {
        "model.embed_tokens.weight": rng.standard_normal((32, 8)),
        "lm_head.weight": rng.standard_normal((32, 8)),
        "model.norm.weight": np.ones(8),
    }
    for i in range(LAYERS):
        t[f"model.layers.{i}.mlp.up_proj.weight"] = rng.standard_normal((16, 8))
        t[f"model.layers.{i}.input_layernorm.weight"] = np.ones(8)
    return {k: v.astype(np.float32) for k, v in t.items()}


def nudged(base: dict[str, np.ndarray], scale: float = 0.01, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        k: (v + scale * rng.standard_normal(v.shape) * np.abs(v).mean()).astype(np.float32)
        for k, v in base.items()
    }


def write(tmp_path, name, tensors):
    p = tmp_path / f"{name}.safetensors"
    save_file(tensors, str(p))
    return p


def test_per_tensor_statistics_are_exact(tmp_path):
    a = {"model.layers.0.w": np.array([3.0, 4.0], dtype=np.float32)}
    b = {"model.layers.0.w": np.array([3.0, 4.0 + 1.0], dtype=np.float32)}
    d = diff_checkpoints(write(tmp_path, "a", a), write(tmp_path, "b", b), chunk=1)
    t = d.tensors[0]
    assert (t.norm_a, t.l2_change, t.max_abs) == (5.0, 1.0, 1.0)
    assert math.isclose(t.rel_change, 0.2) and math.isclose(t.norm_ratio, math.sqrt(34) / 5)


def test_planted_nan_names_its_layer(tmp_path):
    base = model()
    bad = nudged(base)
    bad["model.layers.3.mlp.up_proj.weight"][2, 5] = np.nan
    bad["model.layers.4.mlp.up_proj.weight"][0, 0] = (
        np.inf
    )  # later layers may follow; the first one is the answer
    d = diff_checkpoints(write(tmp_path, "a", base), write(tmp_path, "b", bad))
    assert d.problem_layer == "layers.3" and "non-finite" in d.reason
    t = next(x for x in d.tensors if x.name == "model.layers.3.mlp.up_proj.weight")
    assert (t.nan_b, t.inf_b) == (1, 0) and math.isfinite(t.l2_change)
    assert [x.name for x in d.layers] == [
        "embeddings",
        *[f"layers.{i}" for i in range(LAYERS)],
        "final_norm",
        "lm_head",
    ]
    assert d.top(1)[0][1].name == "model.layers.3.mlp.up_proj.weight"  # non-finite ranks first


def test_outlier_change_names_its_layer(tmp_path):
    base = model()
    b = nudged(base)
    b["model.layers.2.mlp.up_proj.weight"] = base["model.layers.2.mlp.up_proj.weight"] * 3.0
    d = diff_checkpoints(write(tmp_path, "a", base), write(tmp_path, "b", b))
    assert d.problem_layer == "layers.2" and "outlier" in d.reason
    assert d.layers[3].z > 3.5


def test_even_change_has_no_problem_layer(tmp_path):
    base = model()
    d = diff_checkpoints(write(tmp_path, "a", base), write(tmp_path, "b", nudged(base)))
    assert d.problem_layer is None and d.reason.startswith("no problem layer")


def test_lora_adapters_added_and_removed_tensors(tmp_path):
    a = {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.ones((4, 8), np.float32),
        "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight": np.ones((4, 8), np.float32),
    }
    b = {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.ones((4, 8), np.float32) * 2,
        "base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight": np.ones((4, 8), np.float32),
    }
    d = diff_checkpoints(write(tmp_path, "a", a), write(tmp_path, "b", b))
    status = {t.layer: t.status for t in d.tensors}
    assert status == {"layers.0": "changed", "layers.1": "removed", "layers.2": "added"}
    assert d.to_dict()["tensors"][0]["rel_change"] == 1.0

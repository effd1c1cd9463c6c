"""Gradient flow: per-layer statistics from real gradients, and the layer checks on them."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from steadytune.detect.gradflow import check_layers  # noqa: E402
from steadytune.guard.gradflow import (  # noqa: E402
    DEFAULT_BINS,
    columns,
    layer_grad_stats,
    should_record,
    unclip_scale,
)


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(10, 4)
        self.model.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])
        self.model.norm = torch.nn.LayerNorm(4)
        self.lm_head = torch.nn.Linear(4, 10, bias=False)


def with_grads(values: dict[str, float]) -> Tiny:
    m = Tiny()
    for name, p in m.named_parameters():
        p.grad = torch.full_like(p, values.get(name, 0.5))
    return m


def test_stats_per_layer_in_forward_order():
    m = with_grads({"model.layers.1.weight": 0.0, "model.layers.1.bias": 0.0, "lm_head.weight": 2.0})
    m.model.layers[2].weight.grad[0, 0] = 0.0
    stats = layer_grad_stats(m)
    assert list(stats) == ["embeddings", "layers.0", "layers.1", "layers.2", "final_norm", "lm_head"]
    assert math.isclose(stats["layers.0"]["norm"], 0.5 * math.sqrt(20))
    assert stats["layers.1"]["norm"] == 0.0 and stats["layers.1"]["zero_frac"] == 1.0
    assert math.isclose(stats["layers.2"]["zero_frac"], 1 / 20)
    assert math.isclose(stats["lm_head"]["norm"], 2.0 * math.sqrt(40))
    # 0.5 lies in [0.1, 1): the bin from log10 edge -1 to 0; zeros are in no bin
    hist = stats["layers.2"]["hist"]
    assert sum(hist) == 19 and hist[DEFAULT_BINS.index(-1.0)] == 19
    assert sum(stats["layers.1"]["hist"]) == 0


def test_non_finite_gradient_marks_its_layer():
    m = with_grads({})
    m.model.layers[0].weight.grad[1, 1] = float("nan")
    stats = layer_grad_stats(m)
    assert math.isnan(stats["layers.0"]["norm"]) and stats["layers.0"]["nonfinite"] == 1
    assert math.isfinite(stats["layers.1"]["norm"])


def test_columns_shape_for_storage():
    cols = columns(layer_grad_stats(with_grads({})))
    assert set(cols) == {"layers", "norm", "zero_frac", "hist", "bins"}
    assert len(cols["layers"]) == len(cols["norm"]) == len(cols["hist"]) == 6
    assert all(len(h) == len(cols["bins"]) - 1 for h in cols["hist"])


def test_check_layers_flags_dead_vanishing_and_exploding():
    stats = {
        "embeddings": {"norm": 1.0, "zero_frac": 0.99},
        "layers.0": {"norm": 1.0, "zero_frac": 0.1},
        "layers.1": {"norm": 1e-5, "zero_frac": 0.1},
        "layers.2": {"norm": 0.5, "zero_frac": 0.95},
        "layers.3": {"norm": 500.0, "zero_frac": 0.0},
        "lm_head": {"norm": float("nan"), "zero_frac": 0.0},
    }
    limits = {"vanish": 1e-3, "explode": 100.0, "dead_zero_frac": 0.9}
    found = check_layers(stats, step=40, **limits)
    got = [(a.kind, a.metric) for a in found]
    assert got == [
        ("grad_vanishing", "grad_norm/layers.1"),
        ("grad_vanishing", "grad_norm/layers.2"),
        ("grad_explosion", "grad_norm/layers.3"),
        ("grad_explosion", "grad_norm/lm_head"),
    ]
    assert all(a.start_step == 40 for a in found) and "dead units" in found[1].cause
    cols = {
        "layers": list(stats),
        "norm": [s["norm"] for s in stats.values()],
        "zero_frac": [s["zero_frac"] for s in stats.values()],
    }
    assert [
        (a.kind, a.metric) for a in check_layers(cols, step=40, **limits)
    ] == got  # the stored shape works too


def test_should_record():
    assert [s for s in range(1, 201) if should_record(s, 50)] == [1, 50, 100, 150, 200]
    assert not should_record(50, 0)


def test_clipped_gradients_scaled_back_give_the_pre_clip_stats():
    m = with_grads({"model.layers.0.weight": 3.0, "lm_head.weight": 0.02, "model.layers.1.bias": 0.0})
    before = layer_grad_stats(m)
    norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
    assert float(norm) > 10 * 0.5  # clipping engaged
    clipped = layer_grad_stats(m)
    after = layer_grad_stats(m, scale=unclip_scale(float(norm), 0.5))
    for layer, ref in before.items():
        assert after[layer]["norm"] == pytest.approx(ref["norm"], rel=1e-5), layer
        assert after[layer]["hist"] == ref["hist"] and after[layer]["zero_frac"] == ref["zero_frac"], layer
    assert clipped["layers.0"]["norm"] < before["layers.0"]["norm"] / 10


def test_unclip_scale_is_one_when_clipping_left_the_gradients_alone():
    assert unclip_scale(0.3, 1.0) == 1.0
    assert unclip_scale(None, 1.0) == unclip_scale(5.0, 0.0) == unclip_scale(float("nan"), 1.0) == 1.0
    assert unclip_scale(5.0, 1.0) == pytest.approx(5.0)

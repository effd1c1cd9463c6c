"""The estimator's behaviour: what grows, what shrinks, what sums."""

from __future__ import annotations

import dataclasses

import pytest

from steadytune.estimate import COMPONENTS, Architecture, SetupError, TrainSetup, estimate_peak
from steadytune.estimate.activations import head_activations, layer_activations

GiB = 1024**3

SETUPS = [
    TrainSetup(method="full"),
    TrainSetup(method="full", mixed_precision=False, optimizer="adamw8bit", gradient_checkpointing=True),
    TrainSetup(method="lora", target_modules=("all-linear",), lora_dropout=0.1),
    TrainSetup(method="qlora", attn="eager", batch=2, seq=512),
    TrainSetup(method="freeze", optimizer="adafactor"),
    TrainSetup(method="full", zero_stage=3, gpus=8, gradient_accumulation_steps=4),
    TrainSetup(method="full", fsdp=True, gpus=4, optimizer="sgd"),
    TrainSetup(method="lora", device="cpu", dtype="fp32", mixed_precision=False),
]


@pytest.mark.parametrize("setup", SETUPS)
def test_breakdown_sums_to_peak(llama8b: Architecture, setup: TrainSetup) -> None:
    est = estimate_peak(llama8b, setup)
    assert tuple(est.breakdown) == COMPONENTS
    assert sum(est.breakdown.values()) == est.peak_bytes
    assert all(isinstance(v, int) and v >= 0 for v in est.breakdown.values())
    assert est.phase in est.phases
    assert est.phases[est.phase] == est.tensor_bytes == max(est.phases.values())


def test_lora_below_full_and_qlora_below_lora(llama8b: Architecture) -> None:
    base = TrainSetup(batch=1, seq=2048)
    full = estimate_peak(llama8b, dataclasses.replace(base, method="full")).peak_bytes
    lora = estimate_peak(llama8b, dataclasses.replace(base, method="lora")).peak_bytes
    qlora = estimate_peak(llama8b, dataclasses.replace(base, method="qlora")).peak_bytes
    assert qlora < lora < full


def test_gradient_checkpointing_lowers_activations(llama8b: Architecture) -> None:
    for method in ("full", "lora", "qlora"):
        setup = TrainSetup(method=method, batch=4, seq=2048)
        off = estimate_peak(llama8b, setup)
        on = estimate_peak(llama8b, dataclasses.replace(setup, gradient_checkpointing=True))
        assert (
            on.activation_detail["checkpointed"]
            < off.activation_detail["attention"] + off.activation_detail["mlp"]
        )
        assert on.breakdown["activations"] < off.breakdown["activations"]
        assert on.peak_bytes < off.peak_bytes


def test_zero3_divides_model_states_by_gpus(llama8b: Architecture) -> None:
    one = estimate_peak(llama8b, TrainSetup(method="full", zero_stage=3, gpus=1))
    for gpus in (2, 4, 8):
        est = estimate_peak(llama8b, TrainSetup(method="full", zero_stage=3, gpus=gpus))
        # Sharded exactly: fp32 master + Adam states (16 B/param with mixed AdamW) / N.
        assert est.breakdown["optimizer_states"] == pytest.approx(12 * llama8b.total_params / gpus, rel=1e-6)
        assert est.peak_bytes < one.peak_bytes


def test_zero_stages_follow_deepspeeds_formula(llama8b: Architecture) -> None:
    # DeepSpeed's estimator (model states only): stage 2 = 4P + 16P/N; stage 3 = 18P/N + 4 x largest layer.
    p, n = llama8b.total_params, 8
    largest = max(llama8b.embedding_params, llama8b.largest_linear_params)
    for stage, expected in ((2, 4 * p + 16 * p // n), (3, 18 * p // n + 4 * largest)):
        est = estimate_peak(llama8b, TrainSetup(method="full", zero_stage=stage, gpus=n))
        # In the optimizer step every model state is alive and nothing else is.
        assert est.phases["optimizer"] == pytest.approx(expected, rel=1e-6)


def test_fsdp_shards_every_state(llama8b: Architecture) -> None:
    one = estimate_peak(llama8b, TrainSetup(method="full"))
    four = estimate_peak(llama8b, TrainSetup(method="full", fsdp=True, gpus=4))
    assert four.breakdown["optimizer_states"] == one.breakdown["optimizer_states"] // 4


def test_activations_grow_linearly_with_sdpa_and_quadratically_with_eager(tiny: Architecture) -> None:
    def per_token(attn: str, seq: int) -> float:
        return layer_activations(tiny, TrainSetup(method="full", attn=attn, seq=seq), True, True).attention

    assert per_token("sdpa", 1024) == per_token("sdpa", 4096)
    assert per_token("eager", 4096) > per_token("eager", 1024)


def test_gqa_keeps_less_than_multi_head(tiny: Architecture) -> None:
    mha = Architecture(**{**tiny.__dict__, "num_kv_heads": tiny.num_heads})
    setup = TrainSetup(method="full")
    assert (
        layer_activations(tiny, setup, True, True).attention
        < layer_activations(mha, setup, True, True).attention
    )


def test_logits_and_loss_scale_with_vocabulary(tiny: Architecture) -> None:
    setup = TrainSetup(method="lora")
    small = head_activations(tiny, setup)
    big = head_activations(Architecture(**{**tiny.__dict__, "vocab_size": 4 * tiny.vocab_size}), setup)
    assert big.log_softmax == 4 * small.log_softmax
    assert big.backward_extra == 4 * small.backward_extra


def test_lora_rank_and_targets_add_adapter_memory(llama8b: Architecture) -> None:
    few = estimate_peak(llama8b, TrainSetup(method="lora", lora_r=8, target_modules=("q_proj", "v_proj")))
    many = estimate_peak(llama8b, TrainSetup(method="lora", lora_r=64, target_modules=("all-linear",)))
    assert many.breakdown["adapters"] > few.breakdown["adapters"] > 0
    # r=8 on q and v of Llama-3.1-8B: 32 layers x 8 x ((4096+4096) + (4096+1024)) params, fp32.
    assert few.breakdown["adapters"] == 4 * 32 * 8 * (8192 + 5120)


def test_qlora_has_quantization_constants(llama8b: Architecture) -> None:
    est = estimate_peak(llama8b, TrainSetup(method="qlora"))
    assert est.breakdown["quantization_constants"] > 0
    assert estimate_peak(llama8b, TrainSetup(method="lora")).breakdown["quantization_constants"] == 0


def test_gradient_accumulation_keeps_gradients_alive(llama8b: Architecture) -> None:
    setup = TrainSetup(method="full", mixed_precision=False, batch=1, seq=4096)
    once = estimate_peak(llama8b, setup)
    accum = estimate_peak(llama8b, dataclasses.replace(setup, gradient_accumulation_steps=8))
    assert accum.peak_bytes > once.peak_bytes


def test_cpu_has_no_cuda_context_or_margin(tiny: Architecture) -> None:
    est = estimate_peak(tiny, TrainSetup(device="cpu"))
    assert est.breakdown["cuda_context"] == est.breakdown["allocator_margin"] == 0
    assert est.peak_bytes == est.tensor_bytes


def test_published_examples_give_sane_totals(llama8b: Architecture, llama3b: Architecture) -> None:
    full = estimate_peak(
        llama8b, TrainSetup(method="full", dtype="bf16", mixed_precision=True, batch=1, seq=2048)
    )
    assert full.peak_bytes > 80 * GiB
    # fp32 weights, fp32 gradients and AdamW states: 16 bytes/param before any activation.
    assert full.peak_bytes > 16 * llama8b.total_params
    lora = estimate_peak(llama8b, TrainSetup(method="lora", dtype="bf16", batch=1, seq=2048))
    assert 16 * GiB <= lora.peak_bytes <= 30 * GiB
    qlora = estimate_peak(llama8b, TrainSetup(method="qlora", dtype="bf16", batch=1, seq=2048))
    assert 6 * GiB <= qlora.peak_bytes < lora.peak_bytes
    small = estimate_peak(llama3b, TrainSetup(method="lora", batch=1, seq=2048))
    assert small.peak_bytes < lora.peak_bytes


def test_setup_reports_every_problem_at_once() -> None:
    with pytest.raises(SetupError) as info:
        TrainSetup(
            method="dora", dtype="int3", batch=0, optimizer="lion", zero_stage=5, target_modules=("nothing",)
        )
    message = str(info.value)
    for fragment in ("method='dora'", "dtype='int3'", "batch=0", "optimizer='lion'", "zero_stage=5"):
        assert fragment in message


def test_rank_pattern_sizes_each_adapter(llama8b: Architecture) -> None:
    from steadytune.estimate.runconfig import setup_from_config_dict
    from steadytune.estimate.states import param_counts

    per_rank = sum(
        lin.in_features + lin.out_features for lin in llama8b.linears() if lin.name in ("q_proj", "v_proj")
    )
    _, setup = setup_from_config_dict(
        {
            "method": "lora",
            "lora": {"r": 8, "target_modules": ["q_proj", "v_proj"], "rank_pattern": {r"layers\.0\..*": 64}},
        }
    )
    assert setup.lora_rank_pattern == ((r"layers\.0\..*", 64),)
    counts = param_counts(llama8b, setup)
    assert counts.adapter == (llama8b.num_layers - 1) * 8 * per_rank + 64 * per_rank
    plain = param_counts(llama8b, dataclasses.replace(setup, lora_rank_pattern=()))
    assert plain.adapter == llama8b.num_layers * 8 * per_rank
    assert (
        estimate_peak(llama8b, setup).breakdown["adapters"]
        > estimate_peak(llama8b, dataclasses.replace(setup, lora_rank_pattern=())).breakdown["adapters"]
    )

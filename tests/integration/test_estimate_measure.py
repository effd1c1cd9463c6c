"""Measured vs estimated peak on CPU, for a tiny 2-layer Llama trained for real.

The documented tolerance (docs/estimator.md) for the HF Llama family on CPU is 10%;
in practice most cases land within 1%.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from steadytune.cli.main import main
from steadytune.estimate import Architecture, TrainSetup, estimate_peak
from steadytune.estimate.measure import measure_peak

TOLERANCE = 0.10

TINY = Architecture(
    "llama",
    hidden_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    intermediate_size=352,
    vocab_size=2048,
    max_position_embeddings=512,
)


@pytest.mark.parametrize(
    "setup",
    [
        TrainSetup(method="full", batch=2, seq=128),
        TrainSetup(method="full", mixed_precision=False, batch=2, seq=128, attn="eager"),
        TrainSetup(method="full", batch=2, seq=128, gradient_checkpointing=True),
        TrainSetup(method="lora", target_modules=("all-linear",), batch=4, seq=128),
        TrainSetup(method="qlora", target_modules=("all-linear",), batch=2, seq=128),
        TrainSetup(method="freeze", freeze_trainable_layers=1, batch=2, seq=128, optimizer="sgd"),
    ],
    ids=["full-mixed", "full-pure-eager", "full-ckpt", "lora-all", "qlora-all", "freeze-sgd"],
)
def test_measured_peak_matches_estimate(setup: TrainSetup) -> None:
    cpu = TrainSetup(**{**setup.__dict__, "device": "cpu"})
    measured = measure_peak(TINY, cpu, device="cpu")
    estimated = estimate_peak(TINY, cpu).tensor_bytes
    assert measured.device == "cpu"
    assert measured.baseline_bytes > 0 and measured.peak_bytes > measured.baseline_bytes
    assert set(measured.phase_peaks) == {"forward", "backward", "optimizer"}
    assert abs(estimated - measured.peak_bytes) <= TOLERANCE * measured.peak_bytes, (
        f"estimated {estimated} vs measured {measured.peak_bytes}"
    )


def test_measured_baseline_is_the_weights() -> None:
    setup = TrainSetup(method="full", mixed_precision=False, device="cpu", batch=1, seq=64)
    measured = measure_peak(TINY, setup, device="cpu")
    weights = 2 * TINY.total_params  # bf16
    # Plus the RoPE buffers and whatever small tensors the libraries keep at import.
    assert weights <= measured.baseline_bytes <= weights + 8 * 1024**2


def test_cli_measure_reports_both(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    import json

    config = {
        "model_type": "llama",
        "hidden_size": TINY.hidden_size,
        "num_hidden_layers": TINY.num_layers,
        "num_attention_heads": TINY.num_heads,
        "num_key_value_heads": TINY.num_kv_heads,
        "intermediate_size": TINY.intermediate_size,
        "vocab_size": TINY.vocab_size,
        "max_position_embeddings": 512,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code = main(
        ["estimate", "--model", str(path), "--method", "lora", "--batch", "2", "--seq", "64", "--measure"]
    )
    out, _ = capsys.readouterr()
    assert code == 0
    assert "measured on cpu" in out and "estimated tensor peak" in out


def test_cli_measure_refuses_a_model_too_big_for_ram(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the measurement would run on the GPU")
    from pathlib import Path

    model = Path(__file__).resolve().parents[2] / "examples" / "models" / "llama-3.1-8b"
    code = main(["estimate", "--model", str(model), "--method", "full", "--measure"])
    _, err = capsys.readouterr()
    assert code == 1
    assert "would need about" in err and "GiB of RAM" in err

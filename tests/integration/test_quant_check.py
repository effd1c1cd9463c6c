"""quant-check on the demo model with real bitsandbytes: before training, on a dequantized
reference, through `check --quant`, and on a trained QLoRA run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .runs import STEADYTUNE, write_config

REPO = Path(__file__).resolve().parents[2]
QLORA = REPO / "examples" / "qlora.yaml"


def demo_overrides(assets: Path) -> list[str]:
    return [
        f"model.name_or_path={assets / 'model'}",
        f"data.train_file={assets / 'train.jsonl'}",
        f"data.eval_file={assets / 'eval.jsonl'}",
    ]


def steadytune(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STEADYTUNE, *args], capture_output=True, text=True, timeout=400, cwd=cwd)


def test_a_broken_quant_section_is_a_config_error_without_torch(demo_assets: Path) -> None:
    code = (
        "import sys\n"
        "from steadytune.cli.main import main\n"
        f"rc = main(['quant-check', {str(QLORA)!r}, *{demo_overrides(demo_assets)!r}, "
        f"'quant.max_ppl_change=-1'])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "quant.max_ppl_change" in proc.stderr and "got -1" in proc.stderr and "Fix:" in proc.stderr


@pytest.mark.slow
def test_the_qlora_example_gets_figures_per_candidate_and_a_verdict(
    tmp_path: Path, demo_assets: Path
) -> None:
    png = tmp_path / "quant.png"
    proc = steadytune(
        "quant-check", str(QLORA), *demo_overrides(demo_assets), "quant.max_positions=300",
        "--format", "json", "--plot", str(png),
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["go"] == (proc.returncode == 0) and doc["verdict"]["reason"]
    # Whole samples are scored, so the budget is reached within one sample's tokens.
    assert 300 <= doc["tokens"] < 300 + 128
    ref = doc["reference"]
    assert ref["tokens"] == doc["tokens"] and ref["perplexity"] > 1 and ref["tokens_per_s"] > 0
    cands = {c["name"]: c for c in doc["candidates"]}
    assert set(cands) == {"int8", "nf4"}
    for c in cands.values():
        assert c["tokens"] == doc["tokens"]
        assert 0 <= c["mean_kl"] <= c["p99_kl"] or c["p99_kl"] == pytest.approx(c["mean_kl"])
        assert 0 < c["top1"] <= 1 and c["passed"] == (not c["failures"])
        assert 0 < c["weights_bytes"] < ref["weights_bytes"]
    # 8 bits per weight stay closer to the reference than 4: the figures measure the quantization.
    assert cands["int8"]["mean_kl"] < cands["nf4"]["mean_kl"]
    assert cands["nf4"]["weights_bytes"] < cands["int8"]["weights_bytes"]
    skipped = {s["name"]: s["reason"] for s in doc["skipped"]}
    if not torch.cuda.is_available():
        assert (
            "fp8" in skipped and "compute capability >= 8.9" in skipped["fp8"] and "no CUDA" in skipped["fp8"]
        )
    # For method: qlora the verdict is about the 4-bit type it will train with.
    assert doc["verdict"]["go"] == cands["nf4"]["passed"]
    assert png.is_file() and png.stat().st_size > 5000 and doc["plot"] == str(png)


@pytest.mark.slow
def test_a_dequantized_reference_makes_nf4_cost_nothing(tmp_path: Path, demo_assets: Path) -> None:
    """The NF4 weights, dequantized into a float32 model, as the reference: re-quantizing them is exact,
    so the pipeline must report no change; anything else would be an error of the measurement."""
    import bitsandbytes as bnb
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from steadytune.config import load_config
    from steadytune.quant.measure import check_config

    src = demo_assets / "model"
    q = AutoModelForCausalLM.from_pretrained(
        src, quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                    bnb_4bit_compute_dtype=torch.float32),
    )  # fmt: skip
    full = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    replaced = 0
    for name, module in q.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            w = bnb.functional.dequantize_4bit(module.weight.data, module.weight.quant_state).float()
            full.get_submodule(name).weight.data.copy_(w)
            replaced += 1
    assert replaced >= 7 * 2  # every projection of both layers
    deq = tmp_path / "dequantized"
    full.save_pretrained(deq)
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja"):
            (deq / f.name).write_bytes(f.read_bytes())
    cfg_path = write_config(
        tmp_path, demo_assets, model={"name_or_path": str(deq)}, method="qlora",
        quantization={"bnb_4bit_use_double_quant": False},
        quant={"candidates": ["nf4"], "max_positions": 200},
    )  # fmt: skip
    report = check_config(load_config(cfg_path))
    (nf4,) = report.candidates
    assert nf4.ppl_change == pytest.approx(0.0, abs=1e-5)
    assert nf4.mean_kl < 1e-7 and nf4.p99_kl < 1e-6
    assert nf4.top1 >= 0.99
    assert report.verdict.go and report.verdict.use == "nf4"


@pytest.mark.slow
def test_check_quant_adds_the_quant_verdict_to_the_preflight(tmp_path: Path, demo_assets: Path) -> None:
    proc = steadytune(
        "check", "--quant", "--no-data", str(QLORA), *demo_overrides(demo_assets),
        "quant.candidates=[nf4]", "quant.max_positions=100", "quant.max_mean_kl=0.0",
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr  # the preflight may pass; the quant limit cannot
    assert "quant-check (before training)" in out and "verdict: NO-GO" in out
    assert "nf4: mean KL" in out and "is above the limit 0.0000" in out


@pytest.mark.slow
def test_after_training_merged_and_quantized_bases_are_compared_with_the_model_as_trained(
    tmp_path: Path, demo_assets: Path
) -> None:
    proc = steadytune(
        "run", str(QLORA), "--run-id", "q", "--quiet", "--skip-check", *demo_overrides(demo_assets),
        f"run.runs_dir={tmp_path / 'runs'}", "train.max_steps=20", "train.save_steps=10",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = tmp_path / "runs" / "q"
    proc = steadytune("quant-check", str(run), "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["mode"] == "run" and doc["subject"] == str(run / "final")
    assert doc["reference"]["label"] == "adapter on nf4 base (as trained)"
    cands = {c["name"]: c for c in doc["candidates"]}
    assert {"fp-base", "merged", "int8"} <= set(cands)
    # Merging is exact in float32: the merged model is the adapter on the full-precision base.
    assert cands["merged"]["perplexity"] == pytest.approx(cands["fp-base"]["perplexity"], rel=1e-4)
    # ...which is not the model that was trained: the merge moved it off its nf4 base.
    assert cands["merged"]["mean_kl"] > 0
    assert doc["verdict"]["go"] == cands["merged"]["passed"]
    # Trained on the task, the adapter predicts better than a uniform guess: it was loaded and applied.
    vocab = json.loads((demo_assets / "model" / "config.json").read_text())["vocab_size"]
    assert doc["reference"]["perplexity"] < 0.9 * vocab
    assert cands["merged"]["label"] == "merged into float32 base"

"""Run a quant-check: score the reference and each candidate on the same eval tokens.

The reference is scored first and its next-token log-distributions are kept on disk, batch by
batch, so only one model is in memory at a time and each candidate's peak memory is its own.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from steadytune.config.schema import SteadytuneConfig
from steadytune.quant.figures import (
    Figures,
    Skipped,
    Thresholds,
    compare,
    judge,
    near_uniform,
    perplexity,
    verdict,
)
from steadytune.quant.report import QuantReport
from steadytune.quant.tokens import label_logprobs, scored_logprobs, token_kl, top1_matches
from steadytune.scratch import owned_tempdir_for

BNB_KINDS = ("int8", "nf4", "fp4")
FP8_MIN_CAPABILITY = (8, 9)  # fp8 tensor cores: Ada (8.9) and Hopper (9.0) onwards


class QuantCheckError(RuntimeError):
    """The check cannot run at all (no eval tokens, no trained weights); the message says what to do."""


@dataclass
class Variant:
    """One model to score: a short name, what it is, and how to load it onto the device."""

    name: str
    label: str
    load: Callable[[], Any]


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def reference_dtype(cfg: SteadytuneConfig, dev: torch.device) -> str:
    """The training dtype; half precision on a CPU is scored in float32 (what a CPU run trains in)."""
    if dev.type == "cpu" and cfg.model.dtype in ("bfloat16", "float16"):
        return "float32"
    return cfg.model.dtype


def skip_reason(kind: str, dev: torch.device) -> str | None:
    """Why a candidate cannot run on this machine, or None when it can."""
    if kind == "fp8":
        if dev.type != "cuda":
            return (
                "fp8 needs a CUDA GPU with compute capability >= 8.9 (Ada, Hopper or newer); "
                "this machine has no CUDA device"
            )
        cap = torch.cuda.get_device_capability(dev)
        if cap < FP8_MIN_CAPABILITY:
            return (
                f"fp8 needs compute capability >= 8.9; {torch.cuda.get_device_name(dev)} "
                f"has {cap[0]}.{cap[1]}"
            )
        try:
            with _quiet():
                import torchao  # noqa: F401
        except ImportError:
            return "torchao is not installed: pip install 'steadytune[train]'"
        return None
    try:
        with _quiet():
            import bitsandbytes  # noqa: F401
    except ImportError as exc:
        return f"bitsandbytes cannot be imported ({exc}): pip install 'steadytune[train]'"
    return None


# --- eval tokens ---------------------------------------------------------------------------


def eval_batches(cfg: SteadytuneConfig, tok: Any) -> tuple[list[dict[str, torch.Tensor]], str, int]:
    """Batches of the config's eval split (its train split when there is none), up to
    ``quant.max_positions`` scored tokens; with where they came from and how many were scored."""
    from steadytune.data.encode import DataSpec, encode_row
    from steadytune.data.rows import detect_format, load_rows
    from steadytune.train.runner import Collator

    d = cfg.data
    path, split = (d.eval_file, "eval") if d.eval_file else (d.train_file, "train (no data.eval_file)")
    spec = DataSpec(path, d.format, d.text_field, d.max_seq_length, d.train_on_prompt, None)
    rows = load_rows(path)
    fmt = d.format if d.format != "auto" else detect_format(rows, d.text_field)
    samples, scored = [], 0
    for row in rows:
        if scored >= cfg.quant.max_positions:
            break
        enc = encode_row(tok, row, fmt, spec)
        n = sum(1 for x in enc["labels"][1:] if x != -100)
        if n:
            samples.append(enc)
            scored += n
    if not samples:
        raise QuantCheckError(
            f"{path} has no sample with a scored token (every label masked, or the file is empty); "
            "point data.eval_file at samples with a response"
        )
    collate = Collator(tok.pad_token_id)
    size = cfg.quant.batch_size
    batches = [collate(samples[i : i + size]) for i in range(0, len(samples), size)]
    return batches, f"{path} [{split}]", scored


# --- scoring -------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """bitsandbytes warns on every int8 matmul of a float32 input; the table is the output."""
    from transformers.utils import logging as hf_logging

    loggers = [logging.getLogger(n) for n in ("bitsandbytes", "torchao", "torch")]
    levels = [lg.level for lg in loggers]
    bars = hf_logging.is_progress_bar_enabled()
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
        if bars:
            hf_logging.enable_progress_bar()


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _release(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _footprint(model: Any) -> int | None:
    try:
        return int(model.get_memory_footprint())
    except Exception:
        return None


def _forward(
    model: Any, batches: list[dict[str, torch.Tensor]], dev: torch.device
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor, float, int]]:
    """(batch index, scored log-distributions on the CPU, targets, forward seconds, input tokens)."""
    for i, batch in enumerate(batches):
        ids = batch["input_ids"].to(dev)
        mask = batch["attention_mask"].to(dev)
        _sync(dev)
        start = time.perf_counter()
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask).logits
        _sync(dev)
        seconds = time.perf_counter() - start
        logp, targets = scored_logprobs(logits, batch["labels"].to(dev))
        yield i, logp.cpu(), targets.cpu(), seconds, int(mask.sum())


def _score(
    variant: Variant,
    batches: list[dict[str, torch.Tensor]],
    dev: torch.device,
    store: Path,
    ref_ppl: float | None,
) -> Figures:
    """Score one model; the reference (``ref_ppl`` None) stores its distributions in ``store``."""
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    with _quiet():
        model = variant.load()
        model.eval()
        weights = _footprint(model)
        lps: list[float] = []
        kls: list[float] = []
        top1: list[bool] = []
        seconds, inputs = 0.0, 0
        for i, logp, targets, secs, n in _forward(model, batches, dev):
            seconds += secs
            inputs += n
            lps += label_logprobs(logp, targets).tolist()
            if ref_ppl is None:
                torch.save(logp, store / f"{i}.pt")
            else:
                ref = torch.load(store / f"{i}.pt")
                kls += token_kl(ref, logp).tolist()
                top1 += top1_matches(ref, logp).tolist()
    peak = int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None
    del model
    _release(dev)
    rate = inputs / seconds if seconds > 0 else 0.0
    if ref_ppl is None:
        return Figures(variant.name, variant.label, len(lps), perplexity(lps), rate, weights, peak)
    return compare(variant.name, variant.label, ref_ppl, lps, kls, top1, rate, weights, peak)


def evaluate(
    reference: Variant,
    candidates: list[Variant | Skipped],
    batches: list[dict[str, torch.Tensor]],
    dev: torch.device,
) -> tuple[Figures, list[Figures], list[Skipped]]:
    """The reference's figures, each candidate's (not judged yet), and the ones that could not run."""
    done: list[Figures] = []
    skipped = [c for c in candidates if isinstance(c, Skipped)]
    with owned_tempdir_for("steadytune-quant-") as tmp:
        ref = _score(reference, batches, dev, Path(tmp), None)
        for cand in candidates:
            if isinstance(cand, Skipped):
                continue
            try:
                done.append(_score(cand, batches, dev, Path(tmp), ref.perplexity))
            except Exception as exc:  # a backend that imports but cannot run here: say so, go on
                _release(dev)
                skipped.append(
                    Skipped(cand.name, f"{cand.label} failed here: {type(exc).__name__}: {exc}"[:400])
                )
    return ref, done, skipped


# --- loaders -------------------------------------------------------------------------------


def _load_base(cfg: SteadytuneConfig, path: str, dev: torch.device, quantize: str | None, dtype: str) -> Any:
    from transformers import AutoModelForCausalLM

    from steadytune.train.runner import model_kwargs

    kwargs = model_kwargs(cfg, quantize, dtype)
    if quantize is not None and dev.type == "cuda":
        kwargs["device_map"] = {"": dev.index or 0}
    model: Any = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if quantize is None:
        return model.to(dev)
    for module in model.modules():
        if getattr(module, "support_avx512bf16_for_cpu", False):
            # In eval mode on an AVX512-BF16 CPU, bitsandbytes repacks 4-bit weights for a bf16 kernel,
            # which rounds the activations too; training dequantizes into the compute dtype instead,
            # and that is the cost to measure.
            module.support_avx512bf16_for_cpu = False
    return model


def _fp8(model: Any) -> Any:
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, quantize_

    # fp8 matmuls take bf16 activations; the weights are cast before they are quantized.
    model = model.to(torch.bfloat16)
    quantize_(model, Float8DynamicActivationFloat8WeightConfig())
    return model


def _candidate_label(kind: str) -> str:
    return {
        "int8": "int8 (bitsandbytes LLM.int8)",
        "nf4": "nf4 (bitsandbytes 4-bit)",
        "fp4": "fp4 (bitsandbytes 4-bit)",
        "fp8": "fp8 (torchao, dynamic activations)",
    }[kind]


def _quantized(
    cfg: SteadytuneConfig, path: str, dev: torch.device, kind: str, dtype: str, label: str
) -> Variant | Skipped:
    """The model at ``path`` quantized as ``kind``, or why that cannot run here."""
    why = skip_reason(kind, dev)
    if why:
        return Skipped(kind, why)
    if kind == "fp8":
        return Variant(kind, label, lambda: _fp8(_load_base(cfg, path, dev, None, dtype)))
    return Variant(kind, label, lambda: _load_base(cfg, path, dev, kind, dtype))


def config_variants(
    cfg: SteadytuneConfig, dev: torch.device, kinds: list[str]
) -> tuple[Variant, list[Variant | Skipped]]:
    """Before training: the base in its training dtype against each quantized base."""
    path, dtype = cfg.model.name_or_path, reference_dtype(cfg, dev)
    ref = Variant("reference", f"base, {dtype}", lambda: _load_base(cfg, path, dev, None, dtype))
    return ref, [_quantized(cfg, path, dev, k, dtype, _candidate_label(k)) for k in kinds]


def trained_weights(run_root: Path) -> Path:
    """What a run trained: ``final/`` when it completed, else its last verified checkpoint."""
    from steadytune.checkpoint.store import read_pointer
    from steadytune.rundir import RunDir

    run = RunDir(run_root)
    final = run.root / "final"
    if (final / "adapter_config.json").is_file() or (final / "config.json").is_file():
        return final
    for pointer in (run.last_good_pointer, run.latest_pointer):
        target = read_pointer(pointer)
        if target is not None and target.is_dir():
            return target
    raise QuantCheckError(
        f"{run.root} has no final/ model and no verified checkpoint to check; "
        "let the run save one (train.save_steps) or finish"
    )


def run_variants(
    cfg: SteadytuneConfig, weights: Path, dev: torch.device
) -> tuple[Variant, list[Variant | Skipped], str | None]:
    """After training: the model as trained against the other ways of serving it.

    With an adapter the reference is the adapter on the base it trained on (nf4 for QLoRA); the
    candidates are the same adapter on the full-precision base, merged into it (the QLoRA "merge
    onto a different base" loss), and on each quantized base. A full fine-tune is its own base.
    Returns the variants and the one the go / no-go is about (``merged`` for an adapter).
    """
    dtype = reference_dtype(cfg, dev)
    if not (weights / "adapter_config.json").is_file():
        path = str(weights)
        ref = Variant("trained", f"trained model, {dtype}", lambda: _load_base(cfg, path, dev, None, dtype))
        kinds = cfg.quant.candidates
        return (
            ref,
            [_quantized(cfg, path, dev, k, dtype, f"trained model, {_candidate_label(k)}") for k in kinds],
            None,
        )

    from peft import PeftModel

    base = cfg.model.name_or_path
    trained_on = cfg.quantization.bnb_4bit_quant_type if cfg.method == "qlora" else None

    def adapter_on(quantize: str | None) -> Any:
        model = PeftModel.from_pretrained(_load_base(cfg, base, dev, quantize, dtype), str(weights))
        # A quantized base is already placed by its device_map; moving it again is refused.
        return model.to(dev) if quantize is None else model

    def merged() -> Any:
        return adapter_on(None).merge_and_unload()

    on = trained_on or dtype
    ref = Variant("trained", f"adapter on {on} base (as trained)", lambda: adapter_on(trained_on))
    out: list[Variant | Skipped] = []
    if trained_on is not None:
        out.append(Variant("fp-base", f"adapter on {dtype} base", lambda: adapter_on(None)))
    out.append(Variant("merged", f"merged into {dtype} base", merged))
    for kind in cfg.quant.candidates:
        if kind == trained_on:
            continue
        why = skip_reason(kind, dev)
        if why:
            out.append(Skipped(kind, why))
        elif kind == "fp8":
            out.append(Variant(kind, "merged, then fp8 (torchao)", lambda: _fp8(merged())))
        else:
            out.append(
                Variant(
                    kind, f"adapter on {_candidate_label(kind)} base", functools.partial(adapter_on, kind)
                )
            )
    return ref, out, "merged"


# --- the two entry points --------------------------------------------------------------------


def _notes(dev: torch.device, cfg: SteadytuneConfig, ref: Figures, flat: bool, vocab: int) -> list[str]:
    notes = []
    if flat:
        notes.append(
            f"the reference's perplexity {ref.perplexity:.1f} is at least half the vocabulary size "
            f"{vocab}: it "
            "predicts little yet, so its top token wins by a hair and top-1 agreement flips on rounding; "
            "top-1 "
            "is shown but not judged, the perplexity and KL limits decide"
        )
    if dev.type == "cpu":
        notes.append("peak memory is the CUDA allocator's peak: a CPU run shows the weights' size only")
        if cfg.model.dtype in ("bfloat16", "float16"):
            notes.append(
                f"the reference is scored in float32 on the CPU (the config trains in {cfg.model.dtype})"
            )
    return notes


def _report(
    mode: str,
    subject: str,
    cfg: SteadytuneConfig,
    reference: Variant,
    candidates: list[Variant | Skipped],
    planned: str | None,
) -> QuantReport:
    from steadytune.train.data import load_tokenizer

    dev = device()
    limits = Thresholds.of(cfg.quant)
    tok = load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
    batches, data, scored = eval_batches(cfg, tok)
    ref, done, skipped = evaluate(reference, candidates, batches, dev)
    flat = near_uniform(ref.perplexity, len(tok))
    done = [judge(c, limits, top1=not flat) for c in done]
    return QuantReport(
        mode=mode,
        subject=subject,
        data=data,
        device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        tokens=scored,
        limits=limits,
        reference=ref,
        candidates=done,
        skipped=skipped,
        verdict=verdict(done, planned),
        notes=_notes(dev, cfg, ref, flat, len(tok)),
    )


def check_config(cfg: SteadytuneConfig) -> QuantReport:
    """Before training: what quantizing the base costs on the config's own eval data."""
    dev = device()
    planned = cfg.quantization.bnb_4bit_quant_type if cfg.method == "qlora" else None
    kinds = list(cfg.quant.candidates)
    if planned is not None and planned not in kinds:
        kinds.append(planned)  # what the run will train on is always measured
    ref, cands = config_variants(cfg, dev, kinds)
    return _report("config", cfg.model.name_or_path, cfg, ref, cands, planned)


def check_run(run_root: Path, trust_remote_code: bool = False) -> QuantReport:
    """After training: the trained adapter (or model) as trained against its other servings.

    ``trust_remote_code`` is the caller's alone: the run folder's config is not trusted to
    turn on running the model folder's own Python.
    """
    from steadytune.forensics.runview import training_config
    from steadytune.rundir import RunDir

    cfg = training_config(RunDir(run_root).config)
    cfg.model.trust_remote_code = trust_remote_code
    weights = trained_weights(run_root)
    ref, cands, planned = run_variants(cfg, weights, device())
    return _report("run", str(weights), cfg, ref, cands, planned)

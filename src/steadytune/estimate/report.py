"""Render an estimate for people (text) and for programs (the JSON contract)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from steadytune.estimate.arch import Architecture
from steadytune.estimate.limits import Suggestion
from steadytune.estimate.memory import MemoryEstimate
from steadytune.estimate.setup import TrainSetup
from steadytune.units import format_bytes, format_count

_LABELS = {
    "weights": "weights",
    "adapters": "LoRA adapters",
    "quantization_constants": "quantization constants",
    "gradients": "gradients (trainable)",
    "optimizer_states": "optimizer states",
    "activations": "activations",
    "logits_loss": "logits + loss",
    "temporaries": "temporaries",
    "cuda_context": "CUDA context",
    "allocator_margin": "allocator margin",
}

_PHASES = {
    "forward": "at the end of forward (logits + fp32 upcast + log-probabilities)",
    "forward_layer": "inside the last layer's forward",
    "loss": "at the start of backward (cross-entropy gradients over the vocabulary)",
    "lm_head": "in the LM head's backward",
    "top": "in the top layer's backward",
    "bottom": "at the end of backward (all gradients allocated)",
    "optimizer": "in the optimizer step",
}


def to_json(estimate: MemoryEstimate, fits: bool | None, max_micro_batch: int | None) -> dict[str, Any]:
    """The machine-readable contract: exactly these four keys."""
    return {
        "peak_bytes": int(estimate.peak_bytes),
        "breakdown": {name: int(value) for name, value in estimate.breakdown.items()},
        "fits": fits,
        "max_micro_batch": max_micro_batch,
    }


@dataclass(frozen=True)
class Report:
    """Everything the text view shows."""

    arch: Architecture
    setup: TrainSetup
    estimate: MemoryEstimate
    device_memory: int | None = None
    max_micro_batch: int | None = None
    max_seq_len: int | None = None
    suggestions: tuple[Suggestion, ...] = ()
    measured: Any = None  # steadytune.estimate.measure.MeasuredPeak, kept untyped: no torch here
    measured_estimate: MemoryEstimate | None = None  # the estimate for the measured device
    notes: tuple[str, ...] = field(default_factory=tuple)


def _describe(arch: Architecture, setup: TrainSetup) -> list[str]:
    precision = "mixed" if setup.mixed_precision else "pure"
    method = setup.method
    if setup.method in ("lora", "qlora"):
        method += f" r={setup.lora_r} on {','.join(setup.lora_modules)}"
        if setup.lora_rank_pattern:
            method += " (rank_pattern " + ", ".join(f"{k}: {r}" for k, r in setup.lora_rank_pattern) + ")"
    if setup.method == "freeze":
        method += f" (last {setup.freeze_trainable_layers} layers train)"
    shard = ""
    if setup.zero_stage:
        shard = f", ZeRO-{setup.zero_stage}"
    elif setup.fsdp:
        shard = ", FSDP full shard"
    return [
        f"model   {arch.model_type or 'decoder'}: {format_count(arch.total_params)} params, "
        f"{arch.num_layers} layers, "
        f"hidden {arch.hidden_size}, vocab {arch.vocab_size}",
        f"setup   {method}, {setup.dtype} {precision} precision, {setup.optimizer}, micro-batch "
        f"{setup.batch} x seq "
        f"{setup.seq}, checkpointing {'on' if setup.gradient_checkpointing else 'off'}, attn {setup.attn}, "
        f"{setup.gpus} {setup.device} device(s){shard}",
    ]


def to_text(report: Report) -> str:
    """A short, readable account: the verdict, the breakdown, the limits and what to change."""
    est = report.estimate
    lines = _describe(report.arch, report.setup)
    lines.append("")
    verdict = f"peak per device  {format_bytes(est.peak_bytes)}"
    if report.device_memory is not None:
        ok = est.peak_bytes <= report.device_memory
        verdict += f"  of {format_bytes(report.device_memory)}  -> {'FITS' if ok else 'DOES NOT FIT'}"
        verdict += f" ({100 * est.peak_bytes / report.device_memory:.0f}%)"
    lines.append(verdict)
    lines.append(f"the peak happens {_PHASES.get(est.phase, est.phase)}")
    lines.append("")
    width = max(len(label) for label in _LABELS.values())
    for name, value in est.breakdown.items():
        if value:
            share = 100 * value / est.peak_bytes if est.peak_bytes else 0
            lines.append(f"  {_LABELS.get(name, name):<{width}}  {format_bytes(value):>11}  {share:5.1f}%")
    detail = est.activation_detail
    if detail:
        kept = "kept for backward" if not report.setup.gradient_checkpointing else "per recomputed pass"
        lines.append("")
        lines.append(
            f"  activations {kept} (all layers): attention {format_bytes(detail['attention'])}, "
            f"MLP {format_bytes(detail['mlp'])}, norms {format_bytes(detail['norms'])}; "
            f"logits + loss up to {format_bytes(detail['logits_loss'])}"
        )
        if report.setup.gradient_checkpointing:
            lines.append(
                f"  with checkpointing only the layer inputs stay: {format_bytes(detail['checkpointed'])}"
            )
    if report.device_memory is not None:
        lines.append("")
        mb = report.max_micro_batch
        lines.append(
            f"limits on {format_bytes(report.device_memory)}: largest micro-batch at seq {report.setup.seq}: "
            f"{mb if mb is not None else 'none (not even 1 fits)'}; longest seq at micro-batch "
            f"{report.setup.batch}: {report.max_seq_len if report.max_seq_len is not None else 'none'}"
        )
        if est.peak_bytes > report.device_memory and report.suggestions:
            lines.append("")
            lines.append("what to change (one change at a time):")
            for s in report.suggestions:
                mark = "fits" if s.fits else "still too big"
                lines.append(f"  - {s.change}: {format_bytes(s.peak_bytes)} ({mark})")
    if report.measured is not None:
        m = report.measured
        lines.append("")
        ref = (report.measured_estimate or est).tensor_bytes
        err = 100 * (ref - m.peak_bytes) / m.peak_bytes if m.peak_bytes else 0.0
        lines.append(
            f"measured on {m.device}: peak {format_bytes(m.peak_bytes)} vs estimated tensor peak "
            f"{format_bytes(ref)} ({err:+.1f}%)"
        )
        phases = ", ".join(f"{k} {format_bytes(v)}" for k, v in m.phase_peaks.items())
        lines.append(f"  phases: {phases}; baseline {format_bytes(m.baseline_bytes)}; {m.seconds:.1f} s")
        lines.append(f"  instrument: {m.how}")
    for note in report.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)

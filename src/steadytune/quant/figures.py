"""The arithmetic of a quant-check and its go / no-go, on plain numbers (no torch, no I/O).

Per-token values come in from ``tokens.py``; everything here is summary and judgement, so the
same functions serve the config check and the trained-run check, and the tests can feed them
distributions whose answers are known in closed form.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# Fewer bytes per weight first: among candidates that pass, the verdict names the smallest.
BITS_PER_WEIGHT = {"nf4": 4, "fp4": 4, "fp8": 8, "int8": 8}


def perplexity(token_logprobs: Iterable[float]) -> float:
    """exp of the mean negative log-likelihood of the scored tokens (natural log)."""
    values = list(token_logprobs)
    if not values:
        raise ValueError("no scored tokens: perplexity needs at least one")
    return math.exp(-math.fsum(values) / len(values))


def relative_change(value: float, reference: float) -> float:
    """(value - reference) / reference; 0 when both are 0."""
    if reference == 0:
        return 0.0 if value == 0 else math.inf
    return (value - reference) / reference


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks (NumPy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def kl_divergence(p: Sequence[float], q: Sequence[float]) -> float:
    """KL(p || q) in nats for two probability vectors (terms with p = 0 add nothing)."""
    if len(p) != len(q):
        raise ValueError(f"distributions of different sizes ({len(p)} and {len(q)})")
    total = 0.0
    for pi, qi in zip(p, q, strict=True):
        if pi > 0:
            if qi <= 0:
                return math.inf
            total += pi * math.log(pi / qi)
    return total


@dataclass(frozen=True)
class Thresholds:
    """The limits a candidate must stay within (``quant:`` in the config)."""

    max_ppl_change: float = 0.02
    max_mean_kl: float = 0.05
    max_p99_kl: float = 0.5
    min_top1: float = 0.90

    @classmethod
    def of(cls, quant: Any) -> Thresholds:
        return cls(quant.max_ppl_change, quant.max_mean_kl, quant.max_p99_kl, quant.min_top1)


@dataclass
class Figures:
    """What one model scored on the eval tokens; the comparison fields are None on the reference."""

    name: str
    label: str
    tokens: int
    perplexity: float
    tokens_per_s: float
    weights_bytes: int | None = None
    peak_bytes: int | None = None
    ppl_change: float | None = None
    mean_kl: float | None = None
    p99_kl: float | None = None
    top1: float | None = None
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def compare(
    name: str,
    label: str,
    reference_perplexity: float,
    token_logprobs: Sequence[float],
    token_kl: Sequence[float],
    top1_matches: Sequence[bool],
    tokens_per_s: float,
    weights_bytes: int | None = None,
    peak_bytes: int | None = None,
) -> Figures:
    """A candidate's figures from its per-token values, beside the reference's perplexity."""
    if not (len(token_logprobs) == len(token_kl) == len(top1_matches)):
        raise ValueError("per-token values of different lengths")
    ppl = perplexity(token_logprobs)
    return Figures(
        name=name,
        label=label,
        tokens=len(token_logprobs),
        perplexity=ppl,
        tokens_per_s=tokens_per_s,
        weights_bytes=weights_bytes,
        peak_bytes=peak_bytes,
        ppl_change=relative_change(ppl, reference_perplexity),
        mean_kl=math.fsum(token_kl) / len(token_kl),
        p99_kl=percentile(token_kl, 99),
        top1=sum(bool(m) for m in top1_matches) / len(top1_matches),
    )


# A reference this close to uniform (perplexity at least half the vocabulary size) predicts almost
# nothing: its top token wins by a hair, so rounding flips it while the KL stays tiny.
NEAR_UNIFORM = 0.5


def near_uniform(reference_perplexity: float, vocab_size: int) -> bool:
    """Whether the reference is too flat for top-1 agreement to mean anything."""
    return vocab_size > 0 and reference_perplexity >= NEAR_UNIFORM * vocab_size


def judge(fig: Figures, limits: Thresholds, top1: bool = True) -> Figures:
    """Fill ``fig.failures``: each limit it breaks, with the figure and the limit.

    ``top1=False`` leaves top-1 agreement unjudged (a near-uniform reference); it is still shown.
    """
    checks = [
        ("perplexity change", fig.ppl_change, limits.max_ppl_change, "{:+.2%}", "above"),
        ("mean KL", fig.mean_kl, limits.max_mean_kl, "{:.4f}", "above"),
        ("p99 KL", fig.p99_kl, limits.max_p99_kl, "{:.4f}", "above"),
    ]
    if top1:
        checks.append(("top-1 agreement", fig.top1, limits.min_top1, "{:.1%}", "below"))
    fig.failures = [
        f"{what} {fmt.format(value)} is {side} the limit {fmt.format(limit)}"
        for what, value, limit, fmt, side in checks
        if value is not None and (value > limit if side == "above" else value < limit)
    ]
    return fig


@dataclass(frozen=True)
class Skipped:
    """A candidate that could not run here, and exactly why."""

    name: str
    reason: str


@dataclass(frozen=True)
class Verdict:
    go: bool
    use: str | None
    reason: str


def verdict(candidates: Sequence[Figures], planned: str | None = None) -> Verdict:
    """Go / no-go, naming the candidate to use.

    ``planned`` is the quantization the config will train with (nf4 for ``method: qlora``): then
    the go is about that one, and a different passing candidate is named as the way out.
    Otherwise the smallest passing candidate is recommended and there is always a way to go
    (keep full precision), so "no-go" means "do not quantize".
    """
    passing = sorted(
        (c for c in candidates if c.passed), key=lambda c: (BITS_PER_WEIGHT.get(c.name, 16), c.name)
    )
    best = passing[0] if passing else None
    if planned is not None:
        mine = next((c for c in candidates if c.name == planned), None)
        if mine is None:
            return Verdict(
                False,
                best.name if best else None,
                f"{planned}, which the config trains with, was not measured",
            )
        if mine.passed:
            return Verdict(True, planned, f"{planned} is within every limit")
        alt = (
            f"; {best.name} passes: use it instead"
            if best
            else "; no candidate passes: train without quantization (method: lora)"
        )
        return Verdict(
            False, best.name if best else None, f"{planned} fails: {'; '.join(mine.failures)}{alt}"
        )
    if best is None:
        if not candidates:
            return Verdict(False, None, "no candidate could run here")
        return Verdict(False, None, "no candidate is within the limits: keep the base at full precision")
    return Verdict(True, best.name, f"{best.name} is the smallest candidate within every limit")

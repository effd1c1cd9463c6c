"""Per-token values from logits: the log-probability of each label, KL(ref || cand), top-1 match.

Pure tensor functions (no model, no I/O): ``measure.py`` feeds them batches, the tests feed them
distributions whose answers are known.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100


def scored_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token log-distributions at the positions that carry loss, and the tokens they predict.

    Causal LM shift: position t predicts label t+1; masked labels (-100) are not scored, as in
    training. Returns ``(logp [N, vocab] float32, targets [N])``.
    """
    logits = logits[:, :-1, :].float()
    targets = labels[:, 1:]
    keep = targets != IGNORE_INDEX
    return torch.log_softmax(logits[keep], dim=-1), targets[keep]


def label_logprobs(logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) of each scored position."""
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def token_kl(ref_logp: torch.Tensor, cand_logp: torch.Tensor) -> torch.Tensor:
    """KL(ref || cand) of each position, in nats, from two [N, vocab] log-distributions."""
    # Rounding can leave -1e-7 where the two are equal; a divergence is never negative.
    return (ref_logp.exp() * (ref_logp - cand_logp)).sum(-1).clamp_min(0.0)


def top1_matches(ref_logp: torch.Tensor, cand_logp: torch.Tensor) -> torch.Tensor:
    """Whether the candidate's most likely next token is the reference's, per position."""
    return ref_logp.argmax(-1) == cand_logp.argmax(-1)

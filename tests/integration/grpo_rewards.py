"""A reward function for real `trl grpo` runs, imported by TRL from ``--reward_funcs``."""

from __future__ import annotations

from typing import Any


def one_in_five(completions: list[Any], **_: Any) -> list[float]:
    """1 for a completion whose length in characters is a multiple of 5 (about one in five), else 0.

    A binary reward that a group of four completions often earns alike (0.8^4 + 0.2^4, about 41%):
    such a batch has no advantages, and its gradient is the KL term's alone.
    """
    out = []
    for c in completions:
        text = c[-1]["content"] if isinstance(c, list) else str(c)
        out.append(1.0 if len(text) % 5 == 0 else 0.0)
    return out


def always_zero(completions: list[Any], **_: Any) -> list[float]:
    """0 for every completion: a reward function that never fires (a parser that never matches, a
    verifier that rejects every answer). Every group ties, so no batch carries a learning signal."""
    return [0.0 for _ in completions]


def distinct_characters(completions: list[Any], **_: Any) -> list[float]:
    """How varied a completion is: its distinct characters over 32, at most 1. The demo model, untrained,
    samples varied text (about half of that); a policy that collapsed into repeating one token, or into
    stopping at once, earns next to nothing."""
    out = []
    for c in completions:
        text = c[-1]["content"] if isinstance(c, list) else str(c)
        out.append(min(len(set(text)), 32) / 32)
    return out

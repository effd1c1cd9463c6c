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

"""Loss lines a tool prints as a running average, and the start-up bias some of them carry.

Some training scripts print not the step's loss but an exponential moving average of it, made
unbiased at the start by dividing by ``1 - beta^n`` (``n`` the steps averaged so far). Such a
series is judged as printed: it is what the tool's user watches (the same value goes to their
dashboards), and the rules measure its noise as they find it. What is corrected is a known
error in the division: a script that divides by one step too many prints its first losses too
low (by half at the first, by a third at the second, fading over some twenty steps), which
reads as a steep climb at the start of every run (a critical ``divergence`` where nothing went
wrong).

Known so far (:data:`KNOWN`):

- **nanochat** (``base_train``, ``mid_train`` and ``chat_sft``, and their forks):
  ``step 00042/21400 (0.20%) | loss: 3.123456 | lrm: 1.00 | dt: ...`` prints
  ``S_k / (1 - 0.9^(k+1))`` with ``S_k = 0.9 S_(k-1) + 0.1 L_k`` from ``S = 0``, ``k`` the step
  printed. ``base_train`` counts its steps from 0, so ``k + 1`` is the number of steps averaged:
  right. ``mid_train`` and ``chat_sft`` count from 1 (the step is advanced before the line), so
  their step ``k`` has averaged ``k`` steps and is divided by ``1 - 0.9^(k+1)`` instead of
  ``1 - 0.9^k``: step 1 prints 0.53x its loss, step 2 0.70x. A run whose first line is step 1
  is given ``value * (1 - 0.9^(k+1)) / (1 - 0.9^k)``; one that starts at 0 is right as printed;
  one that starts later (a resumed run, its average restored) is left as printed. Its
  ``Step 00042/00650 | Training loss: ...`` lines are the step's own loss, and stay as they are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from steadytune.importers.prefix import strip_prefix

__all__ = ["KNOWN", "Smoothed", "beta_of", "debiased"]


@dataclass(frozen=True)
class Smoothed:
    """A template of averaged loss lines: a cheap substring first, then the line's pattern."""

    tool: str
    needle: str
    pattern: re.Pattern[str]
    beta: float  # the average's decay: S_k = beta S_(k-1) + (1 - beta) L_k


KNOWN: tuple[Smoothed, ...] = (
    Smoothed(
        "nanochat", "| lrm:", re.compile(r"step \d+(?:/\d+)? \([\d.]+%\) \| loss: [-+\d.eE]+ \| lrm: "), 0.9
    ),
)


def beta_of(raw: str) -> float | None:
    """The decay of the average a printed line's loss is, or None for a line of the step's own loss."""
    for known in KNOWN:
        if known.needle in raw and known.pattern.match(strip_prefix(raw)[1]):
            return known.beta
    return None


def debiased(points: Iterable[tuple[int, float]], beta: float) -> list[float]:
    """The averages printed at ``points`` (step, value, in order), each divided by what it averaged.

    A run (the steps from where they start over) whose first step is 1 was divided by one step
    too many (see the module's doc) and is put right; any other is returned as printed.
    """
    out: list[float] = []
    prev: int | None = None
    off_by_one = False
    for step, value in points:
        if prev is None or step <= prev:  # the file's first line, or the steps start over
            off_by_one = step == 1
        prev = step
        if off_by_one:  # its steps count up from 1: never 0, which would divide by 1 - beta^0
            value *= (1.0 - beta ** (step + 1)) / (1.0 - beta**step)
        out.append(value)
    return out

"""Which step a line of a text log is at: the counters scripts print, and how they become one step.

The rules (:mod:`~.text_log` applies them):

- The step is the first ``step N``, ``global_step N``, ``num_updates N``, ``steps: N``,
  ``iter N``, ``iteration N`` or ``batch N`` a line names (any case; also ``step N/M``,
  ``Step: N``, ``step=N``, ``Step [N/M]``, ``global_step=4.0``); a line naming both an
  iteration and a step is at the step. Else torchtune's ``E|N|Loss:``, else a bare ``[N/M]``
  not after the word "epoch", else a ``(N/M)`` (MiniMind's ``Epoch:[1/2](20/6791)``), else a
  progress bar's count when its postfix holds the loss.
- A step written ``N/M`` that restarts as an integer epoch advances counts batches within an
  epoch, and becomes global: ``(epoch - first epoch) * M + N`` (:func:`epoch_steps`).
- LitGPT's evaluation lines name the iteration only; they are at the step of the last line
  that named both (:class:`IterSteps`).
- A log whose records name no step at all is numbered by its epochs where each record is a
  new integer epoch (one line per epoch), else by the order of its records, 1, 2, ...
  (:func:`number_stepless`).
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import NamedTuple

_STEP = re.compile(
    r"(?<![\w.-])(?P<key>global[ _]step|step|num[ _]updates|iteration|iter|batch|steps(?=\s*:))"
    r"\s*(?:[:=#]\s*|\s+)?\[?\s*(\d+)(?:\.0+)?(?![\d.])(?:\s*/\s*(\d+))?",
    re.I,
)
# torchtune's progress bar: "1|12|Loss: 2.34" is epoch|global step|loss.
_TUNE = re.compile(r"^\s*\d+\|(\d+)\|()(?=\s*loss\b)", re.I)
_BRACKET = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\]")
# MiniMind and its kin: "Epoch:[1/2](20/6791) loss:2.9" is batch 20 of 6791 in epoch 1 of 2.
_PAREN = re.compile(r"\(\s*(\d+)\s*/\s*(\d+)\s*\)")
# A tqdm bar's count, when its postfix carries the loss (Lightning's "Epoch 0: 10%|█ | 10/100
# [00:01<00:09, 9.5it/s, v_num=0, train_loss=2.3]"): batches done, and the total.
_BAR = re.compile(r"\|\s*(\d+)/(\d+)\s*\[[^\]]*?(?:it/s|s/it)")
_AFTER_EPOCH = re.compile(r"epoch\s*[:=]?\s*$", re.I)


def find_step_match(text: str) -> re.Match[str] | None:
    """The step's match: its last two groups are the step and the ``M`` of ``N/M`` (or empty)."""
    m = None
    for found in _STEP.finditer(text):
        if m is None:
            m = found
        if found.group("key").lower().startswith(("step", "global")):
            m = found
            break
    if m is None:
        m = _TUNE.match(text)
    if m is None and "/" in text:
        m = next((b for b in _BRACKET.finditer(text) if not _AFTER_EPOCH.search(text, 0, b.start())), None)
        if m is None:
            m = _PAREN.search(text) or _BAR.search(text)
    return m


def find_step(text: str) -> tuple[int, int | None] | None:
    """The step a (prefix-stripped) line names and the ``M`` of ``N/M`` if written so; None if none."""
    m = find_step_match(text)
    if m is None:
        return None
    return step_of(m), total_of(m)


def step_of(m: re.Match[str]) -> int:
    return int(m.group(m.re.groups - 1))


def total_of(m: re.Match[str]) -> int | None:
    total = m.group(m.re.groups)
    return int(total) if total else None


def redrawn(m: re.Match[str]) -> bool:
    """Whether the step is a progress bar's count: a bar is redrawn, each drawing a reading of one
    step, so the last drawing of a step is its value (not the mean of a step's sub-batches)."""
    return m.re is _BAR or m.re is _TUNE


def step_span(m: re.Match[str], total: bool = False) -> tuple[int, int]:
    return m.span(m.re.groups if total else m.re.groups - 1)


class Line(NamedTuple):
    """One record line: who printed it, its step (and the ``M`` of ``N/M``), and its numbers.

    ``step`` is None for a record that names none (placed by :func:`.text_log._placed`).
    ``fields["loss"]`` is whatever loss-like key the line named; ``loss_as`` is that name as
    the log wrote it (``avg_loss``, ``train_loss``), when it is one the series builder tells
    apart (series.TRAIN_LOSS_NAMES): which of several is the loss is decided there, once.
    """

    rank: int | None
    step: int | None
    total: int | None
    fields: dict[str, float]
    loss_as: str = "loss"
    shape: str = ""  # the fields it holds: a script's record lines share one
    redrawn: bool = False  # its step is a progress bar's count (:func:`redrawn`)
    seen: int = 0  # how many lines naming a step (and nothing else read) came before it
    smoothed: float = 0.0  # the decay of the running average its loss is (:mod:`.smoothed`); 0: its own


def epoch_steps(lines: list[Line]) -> list[Line]:
    """Batch-in-epoch steps made global, when they restart as the epoch advances (else unchanged).

    The lines that name their step ``N/M`` carry the count; a line placed at the step named last
    (an evaluation's) follows the line it was placed after.
    """
    counted = [r for r in lines if r.total is not None]
    epochs = [r.fields.get("epoch") for r in counted]
    if not counted or any(
        r.step is None or e is None or e != int(e) for r, e in zip(counted, epochs, strict=True)
    ):
        return lines
    first = min(e for e in epochs if e is not None)
    restarts = any(
        b.fields["epoch"] > a.fields["epoch"] and (b.step or 0) < (a.step or 0) for a, b in pairwise(counted)
    )
    if not restarts:
        return lines
    out: list[Line] = []
    raw: int | None = None
    placed = 0
    for r in lines:
        if r.total is not None:
            raw, placed = r.step, int(r.fields["epoch"] - first) * r.total + (r.step or 0)
            out.append(r._replace(step=placed))
        elif raw is not None and r.step == raw:
            out.append(r._replace(step=placed))
        else:
            out.append(r)
    return out


def number_stepless(lines: list[Line]) -> list[Line]:
    """Steps for records that name none, in a log where no record names one: the epoch where each
    record is a new integer epoch (a log of one line per epoch), else the record's place (1, 2, ...)."""
    epochs = [line.fields.get("epoch") for line in lines]
    known = [e for e in epochs if e is not None and e == int(e)]
    if len(known) == len(epochs) and all(a < b for a, b in pairwise(known)):
        return [line._replace(step=int(e)) for line, e in zip(lines, known, strict=True)]
    return [line._replace(step=i) for i, line in enumerate(lines, 1)]


_ITER_STEP = re.compile(r"\biter(?:ation)?\s*[:=#]?\s*(\d+)\s*[,|]?\s*step\s*[:=#]?\s*(\d+)", re.I)
_ITER_ONLY = re.compile(r"\biter(?:ation)?\s*[:=#]?\s*(\d+)", re.I)


class IterSteps:
    """Iterations to optimizer steps, where a script names both (LitGPT: ``iter 8 step 2``).

    Its evaluation lines name the iteration only (``iter 80: val loss 2.1``); they belong
    to the step of the last line with both whose iteration is not after theirs.
    """

    def __init__(self) -> None:
        self._last: tuple[int, int] | None = None

    def step(self, raw: str, line: Line) -> Line:
        if line.step is None or "iter" not in raw.lower():
            return line
        both = _ITER_STEP.search(raw)
        if both:
            self._last = int(both.group(1)), int(both.group(2))
            return line
        only = _ITER_ONLY.search(raw)
        if self._last is not None and only and int(only.group(1)) == line.step and line.step >= self._last[0]:
            return line._replace(step=self._last[1])
        return line

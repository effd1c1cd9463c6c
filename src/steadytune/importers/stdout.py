"""A training script's lines: its step lines, and the evaluations it prints between them.

llm.c and build-nanoGPT print one line per step and, now and then, a validation or
HellaSwag line that names no step: it belongs to the step printed before it (or the one
after, when the script evaluates before the step it numbers). Each reader brings its own
step-line parser and its evaluation patterns; the loop, the rank choice and the error are here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from steadytune.importers.lines import open_lines
from steadytune.importers.prefix import LowestRank, strip_prefix
from steadytune.importers.series import Series, SeriesBuilder, UnreadableLog, parse_number

StepParser = Callable[[str], "tuple[int, Mapping[str, float | None]] | None"]  # None: a value not read


def read_steps_and_evals(
    path: Path,
    fmt: str,
    parse: StepParser,
    evals: Sequence[tuple[re.Pattern[str], str]],
    eval_step: Callable[[int | None], int],
    missing: str,
) -> Series:
    """The series of ``path``: ``parse`` reads a step line; a line matching one of ``evals`` is that
    field's value (group 1) at ``eval_step(the step printed last)``."""
    b = SeriesBuilder(str(path), fmt)
    ranks = LowestRank(b)
    last: int | None = None
    with open_lines(path) as lines:
        for line in lines:
            rank, text = strip_prefix(line)
            parsed = parse(text)
            if parsed is not None:
                last = parsed[0]
                if ranks.accept(last, rank):
                    b.add_numbers(last, parsed[1])
                continue
            for pattern, name in evals:
                v = pattern.match(text)
                if v is not None:
                    step = eval_step(last)
                    if ranks.accept(step, rank):
                        b.add(step, name, parse_number(v.group(1)))
                    break
    if not len(b):
        raise UnreadableLog(missing)
    b.notes += lines.notes()
    return b.build(require=("loss", "eval_loss"))

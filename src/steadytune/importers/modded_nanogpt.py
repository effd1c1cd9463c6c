"""modded-nanogpt (the NanoGPT speedrun) and its forks: the ``step:N/M key:value`` lines it prints.

::

    step:0/1900 val_loss:10.8329 train_time:0ms step_avg:0.18ms
    step:1/1900 train_time:81ms step_avg:81.06ms
    step:2/1900 train_loss:9.0703 train_time:104ms step_avg:52.04ms tokens_seen:1.05e+06 tokens/sec:7.80e+04

Every step prints a line; every ``val_loss_every`` steps (and the last) a line with
``val_loss`` as well. Most records print no training loss at all (only forks add
``train_loss``): the run is judged on its eval loss and on its pace. ``train_time`` is
the training clock in milliseconds, summed over the steps and stopped while it
evaluates, so the step time of a line is what ``train_time`` grew since the step line
before it, over the steps between them: the series the pace rules (a slow-down, a
stall) judge. ``step_avg`` is that clock over the step number, a running mean that
hides a slow-down for as long as the run already lasted, so it is not kept. The
evaluation line's own ``train_time`` repeats its step's, plus the time the timer took
to stop: it counts for no step. ``train_loss`` is the loss, ``val_loss`` the eval loss,
``tokens/sec`` kept as ``tokens_per_s``; other numeric keys are kept under their names.
The log starts with the script's source code, which is passed over (the tail is sniffed).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from steadytune.importers.format import LogFormat
from steadytune.importers.prefix import strip_prefix
from steadytune.importers.series import Series, parse_number
from steadytune.importers.stdout import read_steps_and_evals

FORMAT = "modded_nanogpt"
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|-?nan|-?inf"
STEP = re.compile(r"^step:(\d+)/\d+\s+(?=\S+:)")
_PAIR = re.compile(r"([\w/]+):(" + _NUM + r")(ms)?(?=\s|$)")
_NAMES = {"train_loss": "loss", "val_loss": "eval_loss", "tokens/sec": "tokens_per_s"}
_DROPPED = frozenset({"step_avg", "train_time"})


class StepLines:
    """Reads the step lines of one log in order: each line's fields, its step time from the last."""

    def __init__(self) -> None:
        self._last: tuple[int, float] | None = None  # the step and train_time (ms) of the last step line

    def __call__(self, text: str) -> tuple[int, dict[str, float | None]] | None:
        m = STEP.match(text)
        if m is None:
            return None
        step = int(m.group(1))
        fields: dict[str, float | None] = {}
        clock: float | None = None
        for key, raw, ms in _PAIR.findall(text, m.end()):
            value = parse_number(raw)
            if key == "train_time":
                # A clock of nan or inf (a damaged line) is no reading: inf made an infinite step
                # time; the next line's time is measured from the last finite one instead.
                clock = value if value is not None and math.isfinite(value) else None
            elif key not in _DROPPED:
                fields[_NAMES.get(key, key)] = value / 1000.0 if ms and value is not None else value
        if "eval_loss" in fields or clock is None:
            return step, fields
        if self._last is not None and step > self._last[0] and clock >= self._last[1]:
            fields["step_time_s"] = (clock - self._last[1]) / 1000.0 / (step - self._last[0])
        self._last = (step, clock)  # a resumed run (the step or the clock went back) starts over
        return step, fields


def sniff(text: str) -> bool:
    if "train_time:" not in text:
        return False
    found = 0
    for line in text.splitlines():
        rest = strip_prefix(line)[1]
        found += bool(STEP.match(rest)) and "train_time:" in rest
        if found >= 2:
            return True
    return False


def read(path: Path) -> Series:
    return read_steps_and_evals(path, FORMAT, StepLines(), (), lambda last: last or 0, "no 'step:N/M' lines")


LOG_FORMAT = LogFormat(FORMAT, order=105, read=read, sniff_text=sniff)

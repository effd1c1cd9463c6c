"""Karpathy's build-nanoGPT (``train_gpt2.py``): its ``log/log.txt`` and what it prints.

``log.txt``, one value per line (``FORMAT``)::

    0 val 10.9495
    0 hella 0.2505
    0 train 10.955029

stdout (``FORMAT_STDOUT``)::

    validation loss: 3.0671
    HellaSwag accuracy: 2451/10042=0.2441
    step  123 | loss: 3.456789 | lr 6.0000e-04 | norm: 0.4567 | dt: 330.12ms | tok/sec: 1588123.45

Steps count from 0 and the script evaluates before it trains and prints step
``N``, so a ``validation loss`` (or HellaSwag) line, which has no step of its
own, goes to the step after the one printed last (0 before any). ``train`` is
the loss, ``val`` the eval loss, ``hella`` the HellaSwag accuracy (``hellaswag``);
``dt`` becomes the step time, ``tok/sec`` is kept as ``tokens_per_s``. Launcher
prefixes are stripped (:mod:`~steadytune.importers.prefix`); with several ranks
the lowest is kept. The original nanoGPT's ``iter N: loss X, time T ms`` lines
are read as a generic text log (:mod:`~steadytune.importers.text_log`).
"""

from __future__ import annotations

import re
from pathlib import Path

from steadytune.importers.format import LogFormat
from steadytune.importers.prefix import strip_prefix
from steadytune.importers.series import Series, parse_number
from steadytune.importers.stdout import read_steps_and_evals

FORMAT = "nanogpt_log"
FORMAT_STDOUT = "nanogpt_stdout"
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|-?nan|-?inf"
LINE = re.compile(r"^(\d+)\s+(train|val|hella)\s+(" + _NUM + r")\s*$")
_KINDS = {"train": "loss", "val": "eval_loss", "hella": "hellaswag"}
STEP = re.compile(r"^step\s+(\d+)\s*\|\s*loss:")
_PART = re.compile(r"^\s*(loss|lr|norm|dt|tok/sec):?\s+(" + _NUM + r")\s*(ms)?\s*$")
_PART_NAMES = {
    "loss": "loss",
    "lr": "lr",
    "norm": "grad_norm",
    "dt": "step_time_s",
    "tok/sec": "tokens_per_s",
}
# The whole line as train_gpt2.py prints it: one match instead of one per column.
_FULL = re.compile(
    r"^step\s+(\d+)\s*\|\s*loss:\s*(" + _NUM + r")\s*\|\s*lr\s+(" + _NUM + r")\s*\|\s*norm:\s*(" + _NUM + r")"
    r"\s*\|\s*dt:\s*(" + _NUM + r")ms\s*\|\s*tok/sec:\s*(" + _NUM + r")\s*$"
)
VAL = re.compile(r"^validation loss:\s*(" + _NUM + r")")
HELLA = re.compile(r"^HellaSwag accuracy:\s*\d+\s*/\s*\d+\s*=\s*(" + _NUM + r")")


def sniff(head: str) -> bool:
    kinds = [m.group(2) for line in head.splitlines()[:50] if (m := LINE.match(strip_prefix(line)[1]))]
    return len(kinds) >= 2 and ("train" in kinds or "val" in kinds)


def sniff_stdout(head: str) -> bool:
    return any(STEP.match(strip_prefix(line)[1]) for line in head.splitlines())


def _parse_line(text: str) -> tuple[int, dict[str, float | None]] | None:
    m = LINE.match(text)
    return None if m is None else (int(m.group(1)), {_KINDS[m.group(2)]: parse_number(m.group(3))})


def read(path: Path) -> Series:
    return read_steps_and_evals(
        path, FORMAT, _parse_line, (), lambda last: 0, "no build-nanoGPT 'N train X' / 'N val X' lines"
    )


def parse_step(text: str) -> tuple[int, dict[str, float]] | None:
    """Step and fields of a ``step N | loss: X | lr Y | norm: Z | dt: Tms | tok/sec: R`` line."""
    full = _FULL.match(text)
    if full is not None:
        step, loss, lr, norm, ms, tps = full.groups()
        return int(step), {
            "loss": float(loss),
            "lr": float(lr),
            "grad_norm": float(norm),
            "step_time_s": float(ms) / 1000.0,
            "tokens_per_s": float(tps),
        }
    m = STEP.match(text)
    if m is None:
        return None
    fields: dict[str, float] = {}
    for part in text.split("|")[1:]:
        pm = _PART.match(part)
        value = parse_number(pm.group(2)) if pm else None
        if pm is None or value is None:
            continue
        if pm.group(1) == "dt":
            value /= 1000.0 if pm.group(3) else 1.0
        fields[_PART_NAMES[pm.group(1)]] = value
    return int(m.group(1)), fields


def read_stdout(path: Path) -> Series:
    return read_steps_and_evals(
        path,
        FORMAT_STDOUT,
        parse_step,
        ((VAL, "eval_loss"), (HELLA, "hellaswag")),
        lambda last: last + 1 if last is not None else 0,
        "no build-nanoGPT 'step N | loss: X' lines",
    )


LOG_FORMAT = LogFormat(FORMAT, order=110, read=read, sniff_text=sniff)
STDOUT_FORMAT = LogFormat(FORMAT_STDOUT, order=120, read=read_stdout, sniff_text=sniff_stdout)

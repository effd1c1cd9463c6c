"""MosaicML Composer's console logger (llm-foundry's stdout): a step header, then one metric a line.

What it prints::

    [epoch=1][batch=16/200]:
             Train time/batch: 15
             Train loss/train/total: 2.3125
             Train metrics/train/LanguageCrossEntropy: 2.3125
             Train lr-DecoupledAdamW/group0: 0.0001
             Train l2_norm/grad/global: 0.8123
             Eval metrics/eval/LanguageCrossEntropy: 2.4011

The header names the step (``batch=N``, the optimizer steps done) and the lines under it
belong to it until the next header. Read: the training loss (``loss/train/total``, else
the train cross-entropy), the eval cross-entropy (else any eval loss) as ``eval_loss``, the
global grad norm (``l2_norm/grad/global``) and the first learning rate (``lr-*/group0``);
other numeric metrics are kept under their own names. The file is this format when a
header is followed by a ``Train`` metric line among its first lines.
"""

from __future__ import annotations

import re
from pathlib import Path

from steadytune.importers.format import LogFormat
from steadytune.importers.lines import open_lines
from steadytune.importers.prefix import strip_prefix
from steadytune.importers.series import Series, SeriesBuilder, UnreadableLog, parse_number

FORMAT = "composer_console"
_HEADER = re.compile(r"^(?:\[epoch=\d+\])?\[batch=(\d+)(?:/\d+)?\]:\s*$")
_METRIC = re.compile(r"^\s*(Train|Eval)\s+(\S.*?):\s*(\S+)\s*$")
_SNIFF = re.compile(r"^(?:\[epoch=\d+\])?\[batch=\d+(?:/\d+)?\]:\s*\n\s+Train \S", re.MULTILINE)
_LOSS = ("loss/train/total", "metrics/train/LanguageCrossEntropy")
_EVAL = ("metrics/eval/LanguageCrossEntropy",)


def sniff(head: str) -> bool:
    return bool(_SNIFF.search(head))


def _name(kind: str, key: str, seen: set[str]) -> str | None:
    """The series name of a metric line, or None when another line of the step already gives it."""
    if kind == "Train":
        if key in _LOSS:
            return None if "loss" in seen else "loss"
        if key == "l2_norm/grad/global":
            return "grad_norm"
        if key.startswith("lr-") and key.endswith("/group0"):
            return "lr"
        return key
    if key in _EVAL or (key.startswith(("loss/eval", "metrics/eval")) and "CrossEntropy" in key):
        return None if "eval_loss" in seen else "eval_loss"
    return f"eval/{key}" if not key.startswith(("metrics/eval", "eval")) else key


def read(path: Path) -> Series:
    b = SeriesBuilder(str(path), FORMAT)
    step: int | None = None
    seen: set[str] = set()
    with open_lines(path) as lines:
        for raw in lines:
            line = strip_prefix(raw)[1] if raw[:1] not in "\t [" else raw.rstrip()
            h = _HEADER.match(line.strip())
            if h:
                step, seen = int(h.group(1)), set()
                continue
            m = _METRIC.match(line) if step is not None else None
            if m is None:
                continue
            name = _name(m.group(1), m.group(2), seen)
            value = parse_number(m.group(3))
            if name is not None and value is not None and step is not None:
                seen.add(name)
                b.add(step, name, value)
    if len(b) == 0:
        raise UnreadableLog("no [batch=N] header followed by Train metric lines")
    b.notes += lines.notes()
    return b.build(require=("loss", "eval_loss"))


LOG_FORMAT = LogFormat(FORMAT, order=70, read=read, sniff_text=sniff)

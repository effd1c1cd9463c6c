"""llm.c ``main.log`` lines: ``s:N trl:X`` (train loss), ``s:N tel:X`` (val loss), more pairs optional."""

from __future__ import annotations

import re
from pathlib import Path

from steadytune.importers.series import Series, SeriesBuilder, UnreadableLog, parse_number

FORMAT = "llmc_log"
LINE = re.compile(r"^s:(\d+)\s+(.*)$")
_PAIR = re.compile(r"(\w+):(\S+)")
_NAMES = {"trl": "loss", "tel": "eval_loss", "lr": "lr", "norm": "grad_norm"}


def sniff(head: str) -> bool:
    return any(LINE.match(line) and ("trl:" in line or "tel:" in line) for line in head.splitlines()[:50])


def read(path: Path) -> Series:
    b = SeriesBuilder(str(path), FORMAT)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LINE.match(line.strip())
            if not m:
                continue
            step = int(m.group(1))
            for key, raw in _PAIR.findall(m.group(2)):
                b.add(step, _NAMES.get(key, key), parse_number(raw))
    if not len(b):
        raise UnreadableLog("no llm.c 's:N trl:X' lines")
    return b.build(require=("loss", "eval_loss"))

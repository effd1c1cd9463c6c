"""Megatron-LM "golden values" JSON: ``{metric: {start_step, end_step, step_interval, values}}``.

``values`` maps a step (as a string) to a number, and the string ``"nan"``
means *not recorded* there, not a NaN loss: it is dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from steadytune.importers.document import read_document
from steadytune.importers.format import LogFormat
from steadytune.importers.series import Series, SeriesBuilder, UnreadableLog, parse_number

FORMAT = "megatron_golden_values"


def sniff(data: Any) -> bool:
    if not isinstance(data, dict) or not data:
        return False
    return all(isinstance(v, dict) and isinstance(v.get("values"), dict) for v in data.values())


def read(path: Path, data: Any | None = None) -> Series:
    if data is None:
        data = read_document(path)
    if not sniff(data):
        raise UnreadableLog("not Megatron golden values: expected {metric: {values: {step: value}}}")
    b = SeriesBuilder(str(path), FORMAT)
    for metric, body in data.items():
        for step_text, raw in body["values"].items():
            try:
                step = int(step_text)
            except ValueError:
                continue
            b.add(step, metric, parse_number(raw, nan_means_missing=True))
    return b.build(require=("loss",))


LOG_FORMAT = LogFormat(FORMAT, order=40, read=read, read_json=read, sniff_row=sniff, sniff_document=sniff)

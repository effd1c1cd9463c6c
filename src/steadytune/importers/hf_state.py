"""Hugging Face ``trainer_state.json``: the ``log_history`` the Trainer keeps in every checkpoint.

Training entries carry ``loss``, ``grad_norm``, ``learning_rate``, ``epoch``;
evaluation entries ``eval_loss``; the last entry is a run summary whose
``train_loss`` is the mean over the run, so it is skipped, not read as a step.
A NaN grad norm is written as the JSON literal ``NaN`` and stays a NaN.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from steadytune.importers.document import read_document
from steadytune.importers.format import LogFormat
from steadytune.importers.series import Series, SeriesBuilder, UnreadableLog, is_summary

FORMAT = "hf_trainer_state"


def sniff(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("log_history"), list)


def read(path: Path, data: Any | None = None) -> Series:
    if data is None:
        data = read_document(path)
    if not sniff(data):
        raise UnreadableLog("not a trainer_state.json: no log_history list")
    b = SeriesBuilder(str(path), FORMAT)
    for entry in data["log_history"]:
        if not isinstance(entry, dict) or is_summary(entry):
            continue
        step = entry.get("step")
        if not isinstance(step, int):
            continue
        b.add_numbers(step, entry)
    return b.build(require=("loss", "eval_loss", "grad_norm"))


LOG_FORMAT = LogFormat(
    FORMAT,
    order=20,
    read=read,
    read_json=read,
    dir_file="trainer_state.json",
    sniff_row=sniff,
    sniff_document=sniff,
)

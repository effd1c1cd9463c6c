"""llm.c (Karpathy's GPT-2 in C/CUDA): its ``main.log`` and what ``train_gpt2cu`` prints.

``main.log`` (``-o DIR``), one ``s:N key:value...`` line per event::

    s:0 tel:11.0031                              tel = val loss
    s:1 trl:10.9512 lr:0.000003 norm:14.80       trl = train loss; lr, norm optional
    s:500 eval:0.2710                            eval = HellaSwag accuracy

stdout (``FORMAT_STDOUT``)::

    step    1/18865 | train loss 11.009955 | norm 15.4012 | lr 1.00e-06 | 417.00 ms | -100.0% bf16 MFU | ...
    step   2/18865 | loss 10.951200 (+0.00z)| norm 14.8000 (+0.00z)| lr 2.00e-06 | 410.10 ms | ...
    val loss 4.502094
    HellaSwag: 2710/10042 = 0.269867

Stdout numbers its steps from 1 (``step N/M`` is the N-th update) and prints a
``val loss`` line after ``N`` updates without a step of its own: it is recorded
at the step printed last (0 before any). ``train_gpt2.c``'s ``step N: train
loss X (took T ms)`` numbers from 0 and evaluates before printing step N, so
its val loss goes to the step after the last one printed. Launcher prefixes are
stripped (:mod:`~steadytune.importers.prefix`); with several ranks the lowest is kept.
"""

from __future__ import annotations

import re
from pathlib import Path

from steadytune.importers.format import LogFormat
from steadytune.importers.prefix import strip_prefix
from steadytune.importers.series import Series, parse_number
from steadytune.importers.stdout import read_steps_and_evals

FORMAT = "llmc_log"
FORMAT_STDOUT = "llmc_stdout"
LINE = re.compile(r"^s:(\d+)\s+(.*)$")
_PAIR = re.compile(r"(\w+):(\S+)")
_NAMES = {"trl": "loss", "tel": "eval_loss", "lr": "lr", "norm": "grad_norm", "eval": "hellaswag"}

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|-?nan|-?inf"
STEP_CU = re.compile(r"^step\s+(\d+)\s*/\s*\d+\s*\|")
STEP_C = re.compile(r"^step\s+(\d+):\s*train loss\s+(" + _NUM + r")\s*\(took\s+(" + _NUM + r")\s*ms\)")
VAL = re.compile(r"^val loss\s+(" + _NUM + r")")
HELLA = re.compile(r"^HellaSwag:\s*\d+\s*/\s*\d+\s*=\s*(" + _NUM + r")")
_PART = re.compile(
    r"^\s*(?:(?P<key>train loss|loss|norm|lr)\s+(?P<value>" + _NUM + r")"
    r"|(?P<ms>" + _NUM + r")\s*ms|(?P<mfu>" + _NUM + r")%\s*\w*\s*MFU|(?P<tps>" + _NUM + r")\s*tok/s)"
)
# The whole line as train_gpt2cu prints it: one match instead of one per column.
_FULL_CU = re.compile(
    r"^step\s+(\d+)\s*/\s*\d+\s*\|\s*(?:train )?loss\s+(" + _NUM + r")(?:\s*\([^)|]*\))?\s*\|"
    r"\s*norm\s+("
    + _NUM
    + r")(?:\s*\([^)|]*\))?\s*\|\s*lr\s+("
    + _NUM
    + r")\s*\|\s*("
    + _NUM
    + r")\s*ms\s*\|"
    r"\s*(" + _NUM + r")%\s*\w*\s*MFU\s*\|\s*(" + _NUM + r")\s*tok/s\s*$"
)
_MS = re.compile(r"\|\s*[\d.]+\s*ms\b")
_PART_NAMES = {"train loss": "loss", "loss": "loss", "norm": "grad_norm", "lr": "lr"}


def sniff(head: str) -> bool:
    lines = (strip_prefix(line)[1] for line in head.splitlines()[:50])
    return any(LINE.match(text) and ("trl:" in text or "tel:" in text) for text in lines)


def sniff_stdout(head: str) -> bool:
    """A ``step N/M | ... loss X | ... | T ms |`` line (the milliseconds column is llm.c's mark)."""
    for line in head.splitlines():
        text = strip_prefix(line)[1]
        if (STEP_CU.match(text) and "loss" in text and _MS.search(text)) or STEP_C.match(text):
            return True
    return False


def _parse_line(text: str) -> tuple[int, dict[str, float | None]] | None:
    m = LINE.match(text)
    if m is None:
        return None
    return int(m.group(1)), {_NAMES.get(k, k): parse_number(raw) for k, raw in _PAIR.findall(m.group(2))}


def read(path: Path) -> Series:
    return read_steps_and_evals(path, FORMAT, _parse_line, (), lambda last: 0, "no llm.c 's:N trl:X' lines")


def parse_step_cu(text: str) -> tuple[int, dict[str, float]] | None:
    """Step and fields of a ``train_gpt2cu`` ``step N/M | ...`` line."""
    full = _FULL_CU.match(text)
    if full is not None:
        step, loss, norm, lr, ms, mfu, tps = full.groups()
        fields: dict[str, float] = {"loss": float(loss), "grad_norm": float(norm), "lr": float(lr)}
        fields["step_time_s"] = float(ms) / 1000.0
        if float(mfu) >= 0:
            fields["mfu_percent"] = float(mfu)
        fields["tokens_per_s"] = float(tps)
        return int(step), fields
    m = STEP_CU.match(text)
    if m is None:
        return None
    fields = {}
    for part in text[m.end() :].split("|"):
        pm = _PART.match(part)
        if pm is None:
            continue
        if pm.group("key"):
            value = parse_number(pm.group("value"))
            if value is not None:
                fields[_PART_NAMES[pm.group("key")]] = value
        elif pm.group("ms"):
            fields["step_time_s"] = float(pm.group("ms")) / 1000.0
        elif pm.group("mfu") and float(pm.group("mfu")) >= 0:  # -100% means "not known for this GPU"
            fields["mfu_percent"] = float(pm.group("mfu"))
        elif pm.group("tps"):
            fields["tokens_per_s"] = float(pm.group("tps"))
    return int(m.group(1)), fields


class _StdoutSteps:
    """train_gpt2cu's ``step N/M |`` lines, or train_gpt2.c's, which evaluate before the step they number."""

    def __init__(self) -> None:
        self.zero_based = False

    def parse(self, text: str) -> tuple[int, dict[str, float]] | None:
        parsed = parse_step_cu(text)
        if parsed is None and (c := STEP_C.match(text)):
            self.zero_based = True
            loss, ms = parse_number(c.group(2)), parse_number(c.group(3))
            fields = {"loss": loss} if ms is None else {"loss": loss, "step_time_s": ms / 1000.0}
            parsed = int(c.group(1)), {k: v for k, v in fields.items() if v is not None}
        return parsed

    def eval_step(self, last: int | None) -> int:
        if last is None:
            return 0
        return last + 1 if self.zero_based else last


def read_stdout(path: Path) -> Series:
    steps = _StdoutSteps()
    return read_steps_and_evals(
        path,
        FORMAT_STDOUT,
        steps.parse,
        ((VAL, "eval_loss"), (HELLA, "hellaswag")),
        steps.eval_step,
        "no llm.c 'step N/M | train loss X' lines",
    )


LOG_FORMAT = LogFormat(FORMAT, order=90, read=read, sniff_text=sniff)
STDOUT_FORMAT = LogFormat(FORMAT_STDOUT, order=100, read=read_stdout, sniff_text=sniff_stdout)

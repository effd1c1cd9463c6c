"""Megatron-LM / Megatron-DeepSpeed text logs: ``iteration N/ M | key: value | ...`` lines.

Logs copied from terminals wrap long lines, so a line that does not end with
"|" is continued by the next ones (joined without a separator: the wrap cut
words in half). Everything else in the file (tracebacks, checkpoint messages,
"time (ms)" tables) is ignored, but for Megatron's ``validation loss at
iteration N ... | lm loss value: X |`` lines, read as the eval loss of step N.
Here "nan" is a real NaN: Megatron-DeepSpeed prints it for a non-finite loss.
An iteration line needs one ``| key: value |`` field to count
(``iteration 10/100 | loss 2.3`` is left to the generic text reader).
Launcher prefixes (``[rank7]:``, timestamps) are tolerated; when several ranks
print the same iteration, the lowest rank's line is kept.

Megatron prints the *average* loss of a logging interval, and only when it is
``>= 0``: a NaN average leaves the field out, and an interval whose iterations
were all skipped (fp16 overflow) averages to a printed ``0.000000E+00``. The
skipped/NaN iteration counts of the line tell these apart from real losses.

NeMo 2's progress printer (``Training epoch 0, iteration 5/99 | lr: 3e-05 |
reduced_train_loss: 9.1 | val_loss: 9.3``) shares the layout and is read here too.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

from steadytune.importers.format import LogFormat
from steadytune.importers.lines import open_lines
from steadytune.importers.prefix import LowestRank, strip_prefix
from steadytune.importers.series import ALIASES, Series, SeriesBuilder, UnreadableLog, parse_number

FORMAT = "megatron_text"
ITERATION = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_HAS_FIELD = re.compile(r"iteration\s+\d+\s*/\s*\d+\s*\|\s*[A-Za-z][^:|]*:\s*\S")
_FIELD = re.compile(r"^\s*([A-Za-z][^:|]*?)\s*:\s*(\S+)\s*$")
_MAX_CONTINUATION = 4
# A line with its own "iteration N/M" (NeMo's "Validation: iteration 1/2" too) starts a record:
# it is never the wrapped tail of the line before.
_OWN_LINE = re.compile(r"iteration\s+\d+\s*/\s*\d+")
# NeMo's progress printer ends its lines on a value, not on "|".
_NEMO = re.compile(r"\bepoch\s+\d+,\s*iteration\s+\d+\s*/")
# f" validation{suffix} loss at {prefix} | {key} value: X | {key} PPL: Y | ", prefix being
# "iteration N", "iteration N on validation set" / "on test set" or "the end of training for val data".
_VALIDATION = re.compile(r"\bvalidation(?P<suffix>-[^\s|]+)?\s+loss\s+at\s+(?P<where>[^|]*)\|(?P<fields>.*)$")
_AT_ITERATION = re.compile(r"iteration\s+(\d+)")
_SKIPPED = "number of skipped iterations"
_NAN = "number of nan iterations"
# NeMo's names; Megatron's own ("lm loss", "grad norm", ...) are in series.ALIASES.
_LOCAL_ALIASES = {
    "reduced_train_loss": "loss",
    "train_loss": "loss",
    "global_batch_size": "samples",
    "global batch size": "samples",
}
_SECONDS = ("train_step_timing in s",)
_MILLISECONDS = ("elapsed time per iteration (ms)",)


def sniff(head: str) -> bool:
    return bool(_HAS_FIELD.search(head))


def _complete(line: str) -> bool:
    """Whether a line needs no wrapped continuation."""
    text = line.rstrip()
    if text.endswith("|"):
        return True
    if _NEMO.search(text):  # complete when its last field has a value
        return bool(_FIELD.match(text.rsplit("|", 1)[-1]))
    return False


def logical_lines(lines: list[str]) -> list[str]:
    """Iteration and validation lines with their wrapped continuations joined back on."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\n")
        i += 1
        if not ITERATION.search(line) and not _VALIDATION.search(line):
            continue
        joined = 0
        while not _complete(line) and i < len(lines) and joined < _MAX_CONTINUATION:
            nxt = lines[i].rstrip("\n")
            if _OWN_LINE.search(nxt) or _VALIDATION.search(nxt) or not nxt.strip():
                break
            line += nxt
            i += 1
            joined += 1
        out.append(line)
    return out


def _fields(text: str) -> dict[str, float]:
    """The numeric ``key: value`` fields of "|"-separated text."""
    fields: dict[str, float] = {}
    for part in text.split("|"):
        fm = _FIELD.match(part)
        if not fm:
            continue
        value = parse_number(fm.group(2))
        if value is not None:
            fields[fm.group(1).strip()] = value
    return fields


def parse_line(line: str) -> tuple[int, dict[str, float]] | None:
    """The step and the numeric fields of one logical iteration line."""
    m = ITERATION.search(line)
    if not m:
        return None
    return int(m.group(1)), _fields(line[m.end() :])


def parse_validation(line: str) -> tuple[int | None, dict[str, float]] | None:
    """``(step, {metric: value})`` of a validation line; step None for "at the end of training".

    The loss of the (unnamed) validation set is ``eval_loss``; other losses, and those of
    named sets (``validation-wiki loss at ...``), keep a name of their own. Test-set lines
    and perplexities (derived from the loss) give nothing.
    """
    m = _VALIDATION.search(line)
    if not m or "test" in m.group("where"):
        return None
    at = _AT_ITERATION.search(m.group("where"))
    suffix = m.group("suffix") or ""
    out: dict[str, float] = {}
    for key, value in _fields(m.group("fields")).items():
        if not key.endswith(" value"):
            continue
        name = key[: -len(" value")].strip()
        if not suffix and ALIASES.get(name) == "loss":
            out["eval_loss"] = value
        else:
            out[f"validation{suffix} {name}"] = value
    return (int(at.group(1)) if at else None), out


def log_interval(steps: list[int]) -> int | None:
    """The most common step gap between consecutive logged iterations (Megatron's --log-interval)."""
    gaps = Counter(b - a for a, b in pairwise(steps) if b > a)
    return gaps.most_common(1)[0][0] if gaps else None


def interval_loss(printed: float | None, fields: dict[str, float], iterations: int) -> float | None:
    """The loss of a logging interval of ``iterations`` iterations; None when none was computed.

    ``printed`` is the loss field of the line (None when absent). Megatron averages the losses of
    the iterations that were not skipped and prints the average only if it is ``>= 0``:
    - all skipped (``skipped >= iterations``): nothing was averaged, the printed 0 is no loss;
    - no loss printed although nothing was skipped: the average failed ``>= 0``, so it was NaN,
      which the NaN gradient norm of that update confirms (bf16 has no loss scaler to skip it);
    - a skipped iteration whose loss was non-finite counts in ``number of nan iterations``: when
      no real average stands beside it, that NaN is the interval's loss.
    """
    skipped = fields.get(_SKIPPED)
    all_skipped = skipped is not None and skipped >= iterations > 0
    if printed is not None and not (all_skipped and printed == 0.0):
        return printed
    if fields.get(_NAN, 0.0) > 0:
        return math.nan
    grad = fields.get("grad norm")
    if printed is None and skipped == 0 and grad is not None and not math.isfinite(grad):
        return math.nan
    return None


def _records(lines: list[str]) -> Iterator[tuple[int, int | None, dict[str, float], bool]]:
    """``(step, rank, fields, is_validation)`` of each record line, steps as the log gives them."""
    last: int | None = None
    for line in logical_lines(lines):
        rank = strip_prefix(line)[0]
        if ITERATION.search(line):
            parsed = parse_line(line)
            if parsed is None:
                continue
            step, fields = parsed
            # NeMo's iteration counts within an epoch; its global step runs on across epochs.
            gs = fields.pop("global_step", None)
            if gs is not None and math.isfinite(gs) and gs >= 0:
                step = int(gs)
            last = step
            yield step, rank, fields, False
            continue
        val = parse_validation(line)
        if val is None:
            continue
        at, metrics = val
        step_of = at if at is not None else last  # "at the end of training": the last iteration
        if step_of is not None and metrics:
            yield step_of, rank, metrics, True


def _same(a: float, b: float | None) -> bool:
    """Equal, NaN being equal to NaN."""
    return b is not None and (a == b or (math.isnan(a) and math.isnan(b)))


def _is_loss(key: str) -> bool:
    return _LOCAL_ALIASES.get(key, ALIASES.get(key)) == "loss"


def read(path: Path) -> Series:
    b = SeriesBuilder(str(path), FORMAT)
    ranks = LowestRank(b)
    with open_lines(path) as lines:
        records = list(_records(list(lines)))
    typical = log_interval([step for step, _, _, val in records if not val])
    prev: int | None = None
    last_val: float | None = None
    kept: dict[int, int] = {}  # step -> rank of the iteration line kept
    for step, rank, fields, is_val in records:
        if is_val:
            # Only the last rank prints validation, with or without the prefix its iteration lines
            # carry: it is dropped only when it names another rank than the one kept for its step.
            if rank is None or kept.get(step, rank) == rank:
                for key, value in fields.items():
                    b.add(step, key, value)
            continue
        if not ranks.accept(step, rank):
            continue
        kept[step] = rank or 0
        # The first line's interval is its own step, unless the run was resumed past that.
        gap = step - prev if prev is not None and step > prev else min(step, typical or step)
        loss_key = next((k for k in fields if _is_loss(k)), None)
        loss = interval_loss(fields.pop(loss_key) if loss_key else None, fields, gap)
        if loss is not None:
            b.add(step, "loss", loss)
        skipped = fields.get(_SKIPPED)
        if skipped is not None:
            b.add(step, "skipped", skipped > 0)
        val_loss = fields.pop("val_loss", None)
        # NeMo repeats the last validation loss on every line until the next validation, which
        # ran after the previous logged step: one eval point per new value, at that step.
        if val_loss is not None and not _same(val_loss, last_val):
            b.add(prev if prev is not None else step, "eval_loss", val_loss)
            last_val = val_loss
        for key, value in fields.items():
            if key in _SECONDS:
                b.add(step, "step_time_s", value)
            elif key in _MILLISECONDS:
                b.add(step, "step_time_s", value / 1000.0)
            else:
                b.add(step, _LOCAL_ALIASES.get(key, key), value)
        prev = step
    if not len(b):
        raise UnreadableLog("no Megatron 'iteration N/ M |' lines")
    b.notes += lines.notes()
    return b.build(require=("loss",))


LOG_FORMAT = LogFormat(FORMAT, order=80, read=read, sniff_text=sniff)

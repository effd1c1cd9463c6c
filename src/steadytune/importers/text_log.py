"""Any text log whose lines name a step and a loss: what training scripts print and ``tee``.

Tried last, after every layout with a reader of its own. The rules:

- Each line first loses its launcher/logger prefix (rank tags, timestamps, log
  levels: see :mod:`steadytune.importers.prefix`).
- A line is a record when it holds **both** a step and a loss. The step is the
  first of ``step N``, ``global_step N``, ``iter N``, ``iteration N`` (any case;
  also ``step N/M``, ``Step: N``, ``step=N``, ``Step [N/M]``), or else a bare
  ``[N/M]`` that does not follow the word "epoch".
- Keys and values are read as ``key value``, ``key: value`` or ``key=value``
  (a ``[`` or ``tensor(`` before the number is allowed). The keys read:

  ========================  ======================================================
  ``loss``                  ``loss``, ``train loss``, ``train_loss``, ``training loss``,
                            ``train/loss``, ``lm loss``, ``avg loss``, ``total loss``
  ``eval_loss``             ``val loss``, ``val_loss``, ``valid loss``, ``validation loss``,
                            ``eval loss``, ``eval_loss``, ``test loss``, ``dev loss``
  ``grad_norm``             ``grad norm``, ``grad_norm``, ``gradient norm``, ``gnorm``,
                            a bare ``norm`` (not ``weight norm`` or ``x_norm``)
  ``lr``                    ``lr``, ``learning rate``, ``learning_rate``
  ``epoch``                 ``epoch``
  ``step_time_s``           ``time``, ``dt``, ``step time``, ``iter time`` with a unit:
                            ``330.12ms`` or ``0.33 s``
  ========================  ======================================================

  A loss may be a train or an eval loss (``step 250: val loss 3.51`` is a record).
  ``nan`` and ``inf`` are real non-finite values. Every other key, and every line
  without both a step and a loss, is ignored.
- The file is such a log only when at least :data:`MIN_RECORDS` records of one
  shape (the same fields) follow each other with increasing or repeated steps,
  so prose or code that mentions a step and a loss is not taken for one.
- When several ranks print the same step, the lowest rank's line is kept.
- Where other lines log the training loss, a line with both a train and an eval loss
  (nanoGPT's ``step 250: train loss X, val loss Y``) is an evaluation: its train loss
  is an estimate over eval batches, kept as ``train_loss_estimate``.
- When the step is written ``N/M`` and restarts as an integer epoch advances
  (``Epoch [2/3], Step [1/500], Loss: 2.1``), it counts batches within an epoch:
  the record's step becomes ``(epoch - first epoch) * M + N``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from steadytune.importers.format import LogFormat
from steadytune.importers.prefix import LowestRank, strip_prefix
from steadytune.importers.series import TRAIN_LOSS_NAMES, Series, SeriesBuilder, UnreadableLog, parse_number

FORMAT = "text_log"
MIN_RECORDS = 3
LOOKED_FOR = (
    "a step (step/iter/iteration N, Step: N, [N/M]) and a loss "
    "(loss/train loss/lm loss/val loss X, as 'key X', 'key: X' or 'key=X')"
)

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?|[-+]?(?:nan|inf)\b"
_STEP = re.compile(
    r"(?<![\w.-])(?P<key>global[ _]step|step|num[ _]updates|iteration|iter|steps(?=\s*:))"
    r"\s*(?:[:=#]\s*|\s+)?\[?\s*(\d+)(?:\.0+)?(?![\d.])(?:\s*/\s*(\d+))?",
    re.I,
)
# torchtune's progress bar: "1|12|Loss: 2.34" is epoch|global step|loss.
_TUNE = re.compile(r"^\s*\d+\|(\d+)\|()(?=\s*loss\b)", re.I)
_BRACKET = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\]")
# A tqdm bar's count, when its postfix carries the loss (Lightning's "Epoch 0: 10%|█ | 10/100
# [00:01<00:09, 9.5it/s, v_num=0, train_loss=2.3]"): batches done, and the total.
_BAR = re.compile(r"\|\s*(\d+)/(\d+)\s*\[[^\]]*?(?:it/s|s/it)")
_AFTER_EPOCH = re.compile(r"epoch\s*[:=]?\s*$", re.I)
_KEYS = {
    "eval_loss": r"(?:val(?:id(?:ation)?)?|eval(?:uation)?|test|dev)[ _/-]?loss",
    # NeMo's reduced_train_loss, OpenRLHF's gpt_loss; LitGPT's "loss train: X".
    "loss": r"(?:reduced[ _]|gpt[ _])?(?:train(?:ing)?[ _/-]?|lm[ _-]?|avg[ _-]?|mean[ _-]?|total[ _-]?)?loss"
    r"(?:[ _]train)?",
    "grad_norm": r"grad(?:ient)?s?[ _-]?norm|gnorm|(?<![a-z] )norm",
    "lr": r"lr|learning[ _-]?rate",
    "epoch": r"epoch",
}
_METRIC = re.compile(
    r"(?<![\w/.-])(?:" + "|".join(f"(?P<{name}>{rx})" for name, rx in _KEYS.items()) + r")(?!\w)"
    r"\s*(?:[:=]\s*|\s+)(?:tensor\(|\[)?\s*(?P<num>" + _NUM + r")(?P<sfx>(?-i:[KMGT])(?![\w.]))?",
    re.I,
)
# nanotron's human_format writes 2500 as "2.5K": the suffix is part of the value.
_SUFFIX = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_DECIMAL = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_TIME = re.compile(
    r"(?<![\w/.-])(?:dt|time|step[ _-]?time|iter(?:ation)?[ _-]?time)\s*(?:[:=]\s*|\s+)"
    r"(?P<num>" + _DECIMAL + r")\s*(?P<unit>ms|s|sec)\b",
    re.I,
)
_SEPARATORS = re.compile(r"[\s/-]+")
# A line's numbers; what is left, with each number replaced by "#", is its template.
_TOKEN = re.compile("(" + _DECIMAL + ")")
_MAX_LAYOUTS = 4096


class Line(NamedTuple):
    """One record line: who printed it, its step (and the ``M`` of ``N/M``), and its numbers.

    ``fields["loss"]`` is whatever loss-like key the line named; ``loss_as`` is that name as
    the log wrote it (``avg_loss``, ``train_loss``), when it is one the series builder tells
    apart (series.TRAIN_LOSS_NAMES): which of several is the loss is decided there, once.
    """

    rank: int | None
    step: int
    total: int | None
    fields: dict[str, float]
    loss_as: str = "loss"


def _find_step(text: str) -> re.Match[str] | None:
    """The step's match: its last two groups are the step and the ``M`` of ``N/M`` (or empty).

    A line that names both an iteration and a step (LitGPT's ``iter 8 step 2``: micro-batches
    and optimizer steps) is at the step; otherwise the first one named; else torchtune's
    ``E|N|Loss:``, a bare ``[N/M]``, and last a progress bar's ``N/M [..it/s``.
    """
    m = None
    for found in _STEP.finditer(text):
        if m is None:
            m = found
        if found.group("key").lower().startswith(("step", "global")):
            m = found
            break
    if m is None:
        m = _TUNE.match(text)
    if m is None:
        m = next((b for b in _BRACKET.finditer(text) if not _AFTER_EPOCH.search(text, 0, b.start())), None)
    if m is None and "/" in text:
        m = _BAR.search(text)
    return m


def find_step(text: str) -> tuple[int, int | None] | None:
    """The step a (prefix-stripped) line names and the ``M`` of ``N/M`` if written so; None if none."""
    m = _find_step(text)
    if m is None:
        return None
    return _step_of(m), _total_of(m)


def _step_of(m: re.Match[str]) -> int:
    return int(m.group(m.re.groups - 1))


def _total_of(m: re.Match[str]) -> int | None:
    total = m.group(m.re.groups)
    return int(total) if total else None


def _step_span(m: re.Match[str], total: bool = False) -> tuple[int, int]:
    return m.span(m.re.groups if total else m.re.groups - 1)


class _Layout(NamedTuple):
    """Where, among a template's numbers, the step, ``M`` and each field are (and a divisor)."""

    step: int
    total: int | None
    fields: tuple[tuple[str, int, float], ...]
    loss_as: str


# template -> layout, or None where the numbers do not line up with what the rules read
_LAYOUTS: dict[str, _Layout | None] = {}


def parse_line(line: str) -> Line | None:
    """The record a line holds; None unless it has both a step and a loss.

    A script prints its lines from a few templates; once a template was read by the
    rules, its other lines are read by position (the same numbers in the same
    places), several times faster.
    """
    if "loss" not in line.lower():
        return None
    rank, text = strip_prefix(line)
    parts = _TOKEN.split(text)
    template = "#".join(parts[0::2])
    layout = _LAYOUTS.get(template)
    if layout is not None:
        tokens = parts[1::2]
        try:
            step = int(tokens[layout.step])
            total = None if layout.total is None else int(tokens[layout.total])
        except ValueError:  # "step 1.5": not a step after all
            pass
        else:
            fields = {name: float(tokens[i]) / div for name, i, div in layout.fields}
            return Line(rank, step, total, fields, layout.loss_as)
    parsed = _parse_text(text)
    if template not in _LAYOUTS and len(_LAYOUTS) < _MAX_LAYOUTS:
        _LAYOUTS[template] = None if parsed is None else _layout(parts, *parsed)
    if parsed is None:
        return None
    return Line(rank, parsed[0][0], parsed[1][0] if parsed[1] else None, parsed[2], parsed[4])


Span = tuple[int, int]


Parsed = tuple[
    tuple[int, Span], tuple[int, Span] | None, dict[str, float], dict[str, tuple[Span, float]], str
]


def _parse_text(text: str) -> Parsed | None:
    """The rules: step, ``M``, fields, where each number was (with its divisor), and the loss's name."""
    fields: dict[str, float] = {}
    spans: dict[str, tuple[Span, float]] = {}
    loss_as = "loss"
    for m in _METRIC.finditer(text):
        value = parse_number(m.group("num"))
        name = _name(m)
        if value is not None and name not in fields:
            scale = _SUFFIX[m.group("sfx").upper()] if m.group("sfx") else 1.0
            fields[name] = value * scale
            spans[name] = m.span("num"), 1.0 / scale
            if name == "loss":
                written = _SEPARATORS.sub("_", m.group("loss").strip().lower())
                loss_as = written if written in TRAIN_LOSS_NAMES else "loss"
    if "loss" not in fields and "eval_loss" not in fields:
        return None
    found = _find_step(text)
    if found is None:
        return None
    t = _TIME.search(text)
    if t:
        div = 1000.0 if t.group("unit").lower() == "ms" else 1.0
        fields["step_time_s"] = float(t.group("num")) / div
        spans["step_time_s"] = t.span("num"), div
    step = _step_of(found), _step_span(found)
    t_value = _total_of(found)
    total = (t_value, _step_span(found, total=True)) if t_value is not None else None
    return step, total, fields, spans, loss_as


def _layout(
    parts: list[str],
    step: tuple[int, Span],
    total: tuple[int, Span] | None,
    fields: dict[str, float],
    spans: dict[str, tuple[Span, float]],
    loss_as: str,
) -> _Layout | None:
    """The positions of the rules' numbers among the template's, if each is one whole number."""
    index: dict[Span, int] = {}
    pos = 0
    for i, part in enumerate(parts):
        if i % 2:
            index[pos, pos + len(part)] = i // 2
        pos += len(part)
    try:
        return _Layout(
            index[step[1]],
            None if total is None else index[total[1]],
            tuple((name, index[span], div) for name, (span, div) in spans.items()),
            loss_as,
        )
    except KeyError:
        return None


def _name(m: re.Match[str]) -> str:
    return next(name for name in _KEYS if m.group(name) is not None)


def _longest_run(head: str) -> tuple[int, int]:
    """Record lines in ``head``, and the longest run with increasing or repeated steps.

    Runs are counted per shape (the fields a line holds, and whether its step is
    ``N/M``): a script prints its train lines, and its eval lines, from one
    template each, while code or prose that happens to name a step and a loss does not.
    """
    count, best = 0, 0
    runs: dict[tuple[bool, tuple[str, ...]], tuple[int, int]] = {}
    for line in head.splitlines():
        parsed = parse_line(line)
        if parsed is None:
            continue
        count += 1
        shape = (parsed.total is None, tuple(sorted(parsed.fields)))
        run, last = runs.get(shape, (0, parsed.step))
        run = run + 1 if parsed.step >= last else 1
        runs[shape] = run, parsed.step
        best = max(best, run)
        if best >= MIN_RECORDS:
            break
    return count, best


def sniff(head: str) -> bool:
    return _longest_run(head)[1] >= MIN_RECORDS


def why_not(head: str) -> str:
    """Why ``head`` is not a text log, in a few words."""
    count = _longest_run(head)[0]
    if count == 0:
        return f"no line with {LOOKED_FOR}"
    if count < MIN_RECORDS:
        return f"only {count} line(s) with a step and a loss; a text log needs {MIN_RECORDS} in a row"
    return (
        f"{count} lines with a step and a loss, but their steps do not increase {MIN_RECORDS} times in a row"
    )


def _epoch_steps(lines: list[Line]) -> list[Line]:
    """Batch-in-epoch steps made global, when they restart as the epoch advances (else unchanged)."""
    first: float | None = None
    restarts = False
    prev: Line | None = None
    for line in lines:
        epoch = line.fields.get("epoch")
        if line.total is None or epoch is None or epoch != int(epoch):
            return lines
        first = epoch if first is None else min(first, epoch)
        if prev is not None and epoch > prev.fields["epoch"] and line.step < prev.step:
            restarts = True
        prev = line
    if not restarts or first is None:
        return lines
    return [r._replace(step=int(r.fields["epoch"] - first) * (r.total or 0) + r.step) for r in lines]


_ITER_STEP = re.compile(r"\biter(?:ation)?\s*[:=#]?\s*(\d+)\s*[,|]?\s*step\s*[:=#]?\s*(\d+)", re.I)
_ITER_ONLY = re.compile(r"\biter(?:ation)?\s*[:=#]?\s*(\d+)", re.I)


class _IterSteps:
    """Iterations to optimizer steps, where a script names both (LitGPT: ``iter 8 step 2``).

    Its evaluation lines name the iteration only (``iter 80: val loss 2.1``); they belong
    to the step of the last line with both whose iteration is not after theirs.
    """

    def __init__(self) -> None:
        self._last: tuple[int, int] | None = None

    def step(self, raw: str, line: Line) -> Line:
        if "iter" not in raw.lower():
            return line
        both = _ITER_STEP.search(raw)
        if both:
            self._last = int(both.group(1)), int(both.group(2))
            return line
        only = _ITER_ONLY.search(raw)
        if self._last is not None and only and int(only.group(1)) == line.step and line.step >= self._last[0]:
            return line._replace(step=self._last[1])
        return line


def _parsed(f: Iterable[str]) -> list[Line]:
    iters = _IterSteps()
    out = []
    for raw in f:
        line = parse_line(raw)
        if line is not None:
            out.append(iters.step(raw, line))
    return out


def _evaluation_estimates(lines: list[Line]) -> list[Line]:
    """The train loss of an evaluation line kept apart, where other lines log the training loss.

    nanoGPT's ``step 250: train loss 1.91, val loss 2.05`` is an estimate over eval batches
    with the model in eval mode, not the loss of step 250; at a step no ``iter`` line logged,
    it would stand in the training series as a point from another distribution.
    """
    if not any("loss" in r.fields and "eval_loss" not in r.fields for r in lines):
        return lines
    out = []
    for r in lines:
        if "loss" in r.fields and "eval_loss" in r.fields:
            fields = dict(r.fields)
            fields["train_loss_estimate"] = fields.pop("loss")
            r = r._replace(fields=fields)
        out.append(r)
    return out


def read(path: Path) -> Series:
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = _evaluation_estimates(_parsed(f))
    b = SeriesBuilder(str(path), FORMAT, in_order=True)
    ranks = LowestRank(b)
    for line in _epoch_steps(lines):
        if ranks.accept(line.step, line.rank):
            fields = line.fields
            if line.loss_as != "loss" and "loss" in fields:  # the builder decides which is the loss
                fields = {line.loss_as if k == "loss" else k: v for k, v in fields.items()}
            b.add_numbers(line.step, fields)
    if len(b) < MIN_RECORDS:
        raise UnreadableLog(f"fewer than {MIN_RECORDS} steps with a loss; looked for lines with {LOOKED_FOR}")
    return b.build(require=("loss", "eval_loss"))


# The catch-all, tried last.
LOG_FORMAT = LogFormat(FORMAT, order=1000, read=read, sniff_text=sniff)

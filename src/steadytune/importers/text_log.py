"""Any text log whose lines name a step and a loss: what training scripts print and ``tee``.

Tried last, after every layout with a reader of its own. The rules:

- Each line first loses its launcher/logger prefix (rank tags, timestamps, log
  levels: see :mod:`steadytune.importers.prefix`).
- A line is a record when it holds a training signal: a loss (any loss-like key:
  ``loss``, ``train loss``, ``act_loss``, ``dpo_loss``), a reward, or a KL. Its step
  is the counter it names (:mod:`~steadytune.importers.text_steps`).
- Keys and values are read as ``key value``, ``key: value`` or ``key=value``
  (a ``[`` or ``tensor(`` before the number is allowed). The keys read by name:

  ========================  ======================================================
  ``loss``                  ``loss``, ``train loss``, ``train_loss``, ``training loss``,
                            ``train/loss``, ``lm loss``, ``avg loss``, ``ave loss``, ``total loss``;
                            ``train/CrossEntropyLoss``, ``CE loss`` where no other is logged
  ``eval_loss``             ``val loss``, ``val_loss``, ``valid loss``, ``validation loss``,
                            ``eval loss``, ``eval_loss``, ``test loss``, ``dev loss``
  ``grad_norm``             ``grad norm``, ``grad_norm``, ``gradient norm``, ``gnorm``,
                            a bare ``norm`` (not ``weight norm`` or ``x_norm``), ``Grad: X``
  ``lr``                    ``lr``, ``learning rate``, ``learning_rate``
  ``epoch``                 ``epoch``
  ``step_time_s``           ``time``, ``dt``, ``step time``, ``iter time`` with a unit:
                            ``330.12ms`` or ``0.33 s``
  ``mem_peak_bytes``        ``Peak GPU Memory (MB)``, ``max gpu mem (GiB)``: the unit in the key
                            (OLMo's ``System/Peak GPU Memory (MB)=38,869``), read in bytes
  ========================  ======================================================

  A perplexity (``ppl``, ``perplexity``, ``val ppl``; ``train ppl`` for the training one) on a line
  that names no loss is also read as the loss it is the exponential of (an evaluation's, unless
  it says train).
  Every other ``key: value`` / ``key=value`` of a record is kept under its key, lower-cased
  with spaces as ``_`` (``Reward: 0.38`` is ``reward``, ``KL_ref: 0.001`` is ``kl_ref``,
  ``Actor Loss`` is ``actor_loss``); a list of per-sample values (``rewards: tensor([1., 0.])``)
  is its mean, and its spread as ``<key>_std``. A dict printed after a key
  (``reward_data: {'total_num': 256, 'total_reward': 144.0}``) gives its numbers under the key,
  nested keys joined with dots (``reward_data.total_reward``), read without evaluating it
  (:mod:`~steadytune.importers.inline_dict`); where it tallies a batch (a count beside
  ``total_<x>`` sums), also each sum's mean, ``reward_data.mean_reward``.
  A loss may be a train or an eval loss (``step 250: val loss 3.51`` is a record).
  ``nan`` and ``inf`` are real non-finite values.
- The file is such a log only when at least :data:`MIN_RECORDS` records of one
  shape (the same fields) follow each other with increasing or repeated steps,
  so prose or code that mentions a step and a loss is not taken for one.
- Records that name no step, in a log whose other records do, are at the step named last
  (DeepSpeed-Chat's ``average reward score: 3.4`` after its ``step: 12|act_loss: ...`` line),
  when a line of theirs comes back (:data:`MIN_RECORDS` times: a closing summary is no
  record) and logs what the stepped ones do not. In a log where no record names a step,
  they are numbered (:func:`~.text_steps.number_stepless`).
- A line that names a step and nothing else, followed by indented lines of one ``key=value``
  or ``key: value`` each, is one record (OLMo's ``[step=10/10000,epoch=0]`` block of
  ``    train/CrossEntropyLoss=9.064`` lines): the block is read as one line.
- A number with thousands separators (``tokens_per_second=105,477``) is one value.
- When several ranks print the same step, the lowest rank's line is kept.
- A loss a known tool prints as a running average keeps its value, less the start-up bias
  that tool leaves in it (:mod:`~steadytune.importers.smoothed`: nanochat's mid-training and
  SFT lines).
- Where other lines log the training loss, a line with both a train and an eval loss
  (nanoGPT's ``step 250: train loss X, val loss Y``) is an evaluation: its train loss
  is an estimate over eval batches, kept as ``train_loss_estimate``.
- When the step is written ``N/M`` and restarts as an integer epoch advances
  (``Epoch [2/3], Step [1/500], Loss: 2.1``), it counts batches within an epoch:
  the record's step becomes ``(epoch - first epoch) * M + N``.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from steadytune.importers import series
from steadytune.importers.format import LogFormat
from steadytune.importers.inline_dict import parse_dict
from steadytune.importers.lines import open_lines
from steadytune.importers.prefix import LowestRank, strip_prefix
from steadytune.importers.series import TRAIN_LOSS_NAMES, Series, SeriesBuilder, UnreadableLog, parse_number
from steadytune.importers.smoothed import beta_of, debiased
from steadytune.importers.text_steps import (
    IterSteps,
    Line,
    epoch_steps,
    find_step,
    find_step_match,
    number_stepless,
    redrawn,
    step_of,
    step_span,
    total_of,
)

__all__ = ["FORMAT", "LOG_FORMAT", "Line", "find_step", "parse_line", "read", "sniff", "why_not"]

FORMAT = "text_log"
MIN_RECORDS = 3
LOOKED_FOR = (
    "a step (step/iter/iteration/batch N, Step: N, [N/M], (N/M)) and a loss or reward "
    "(loss/train loss/lm loss/val loss/reward X, as 'key X', 'key: X' or 'key=X')"
)

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?|[-+]?(?:nan|inf)\b"
# A count printed with thousands separators (OLMo's ``throughput/total_tokens=5,242,880``); not a
# pair of numbers, which a list or a tuple writes with a space or other digits after the comma.
_THOUSANDS = r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])"
_KEYS = {
    "eval_loss": r"(?:val(?:id(?:ation)?)?|eval(?:uation)?|test|dev)[ _/-]?loss",
    # NeMo's reduced_train_loss, OpenRLHF's gpt_loss; LitGPT's "loss train: X".
    "loss": r"(?:reduced[ _]|gpt[ _])?"
    r"(?:train(?:ing)?[ _/-]?|lm[ _-]?|av(?:g|e|erage)[ _-]?|mean[ _-]?|total[ _-]?)?loss(?:[ _]train)?",
    "grad_norm": r"grad(?:ient)?s?[ _-]?norm|gnorm|(?<![a-z] )norm|grad(?=\s*[:=])",
    "lr": r"lr|learning[ _-]?rate",
    "epoch": r"epoch",
}
_METRIC = re.compile(
    r"(?<![\w/.-])(?:" + "|".join(f"(?P<{name}>{rx})" for name, rx in _KEYS.items()) + r")(?!\w)"
    r"\s*(?:[:=]\s*|\s+)(?:tensor\(|\[)?\s*(?P<num>" + _NUM + r")(?P<sfx>(?-i:[KMGT])(?![\w.]))?",
    re.I,
)
# Any other "key: value" / "key=value" of a record, a key of up to four words ("Avg Response Len");
# not a percentage (a progress bar's "SFT:  3%|").
_PAIR = re.compile(
    r"(?<![\w/.@'\"-])['\"]?(?P<key>[A-Za-z][\w/.@-]*(?: [A-Za-z][\w/.@-]*){0,3}?)['\"]?\s*[:=]\s*"
    r"(?:(?:np\.\w+|tensor|float)\(\s*)?(?:(?P<num>" + _THOUSANDS + "|" + _NUM + r")(?![\d.]*\s*%)"
    r"|(?P<list>\[[^\]\[]*\]))",
    re.I,
)
# A key whose value is a printed dict: "reward_data: {", "metrics={".
_DICT_KEY = re.compile(r"(?<![\w/.@'\"-])['\"]?(?P<key>[A-Za-z][\w/.@-]*)['\"]?\s*[:=]\s*\{")
# A key of several words starts a line or follows a separator: ", Adv Std: 0.9", "|  Actor Loss: 0".
_AFTER_SEPARATOR = re.compile(r"(?:^|[,;|)\]}]\s*|\s-\s+|\s{2,}|\t)$")
# A record holds a training signal: a loss of any name, a reward, a KL. (``loss_scale`` is fp16's
# scaler, no loss; a "score" alone is too often a sample's grade printed as the run goes.)
_SIGNAL = re.compile(
    r"(?:^|[_/.]|crossentropy)loss$|(?:^|[_/.])(?:rewards?|kl)(?:$|[_/.])|(?:^|_)(?:ppl|perplexity)$"
)
# A perplexity is exp(loss): DeepSpeed-Chat's SFT logs its evaluation as "ppl: 2.01" alone.
_PERPLEXITY = re.compile(
    r"^(?:(?P<train>train(?:ing)?)_|(?:eval|val|valid|validation|test|dev)_)?(?:ppl|perplexity)$"
)
# nanotron's human_format writes 2500 as "2.5K": the suffix is part of the value.
_SUFFIX = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_DECIMAL = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
# A peak of device memory with its unit in the key (OLMo's ``System/Peak GPU Memory (MB)=38,869``,
# torch's max_memory_allocated in 10^6 bytes): the record's mem_peak_bytes.
_PEAK_MEMORY = re.compile(
    r"(?<![\w.-])(?:system/)?(?:peak|max)[ _]?gpu[ _]?mem(?:ory)?[ _]?\((?P<unit>[MG]i?B)\)\s*[:=]\s*"
    r"(?P<num>" + _THOUSANDS + "|" + _DECIMAL + r")(?![\w.])",
    re.I,
)
_BYTES = {"mb": 1e6, "gb": 1e9, "mib": float(1 << 20), "gib": float(1 << 30)}
_TIME = re.compile(
    r"(?<![\w/.-])(?:dt|time|step[ _-]?time|iter(?:ation)?[ _-]?time)\s*(?:[:=]\s*|\s+)"
    r"(?P<num>" + _DECIMAL + r")\s*(?P<unit>ms|s|sec)\b",
    re.I,
)
_SEPARATORS = re.compile(r"[\s/-]+")
_SPACES = re.compile(r"\s+")
# A line's numbers; what is left, with each number replaced by "#", is its template.
_TOKEN = re.compile("(" + _DECIMAL + ")")
_MAX_LAYOUTS = 4096


class _Layout(NamedTuple):
    """Where, among a template's numbers, the step, ``M`` and each field are (and a divisor)."""

    step: int | None
    total: int | None
    fields: tuple[tuple[str, int, float], ...]
    loss_as: str
    shape: str
    redrawn: bool
    means: bool  # the means of a printed dict's sums (:func:`_means_of_sums`), computed again


# template -> layout, or None where the numbers do not line up with what the rules read
_LAYOUTS: dict[str, _Layout | None] = {}


def _might_hold_a_record(line: str) -> bool:
    if "loss" in line or "Loss" in line:  # most lines of most logs: no lower-casing
        return True
    low = line.lower()
    return "loss" in low or "reward" in low or "kl" in low or "ppl" in low or "perplexity" in low


def parse_line(line: str) -> Line | None:
    """The record a line holds; None unless it holds a training signal (a loss, a reward, a KL).

    A script prints its lines from a few templates; once a template was read by the
    rules, its other lines are read by position (the same numbers in the same
    places), several times faster.
    """
    if not _might_hold_a_record(line):
        return None
    rank, text = strip_prefix(line)
    parts = _TOKEN.split(text)
    template = "#".join(parts[0::2])
    layout = _LAYOUTS.get(template)
    if layout is not None:
        tokens = parts[1::2]
        try:
            step = None if layout.step is None else int(tokens[layout.step])
            total = None if layout.total is None else int(tokens[layout.total])
        except ValueError:  # "step 1.5": not a step after all
            pass
        else:
            fields = {name: float(tokens[i]) / div for name, i, div in layout.fields}
            if layout.means:
                fields.update(_means_of_sums(fields))
            return Line(rank, step, total, fields, layout.loss_as, layout.shape, layout.redrawn)
    parsed = _parse_text(text)
    if template not in _LAYOUTS and len(_LAYOUTS) < _MAX_LAYOUTS:
        _LAYOUTS[template] = None if parsed is None else _layout(parts, *parsed)
    if parsed is None:
        return None
    at, of, fields, _spans, loss_as, bar = parsed
    return Line(rank, at[0] if at else None, of[0] if of else None, fields, loss_as, _shape(fields), bar)


def _shape(fields: dict[str, float]) -> str:
    return ",".join(sorted(fields))


Span = tuple[int, int]


At = tuple[int, Span]
Parsed = tuple[At | None, At | None, dict[str, float], dict[str, tuple[Span, float]], str, bool]


def _parse_text(text: str) -> Parsed | None:
    """The rules: step, ``M``, fields, where each number was (with its divisor), the loss's name, and
    whether the step is a progress bar's count."""
    fields: dict[str, float] = {}
    spans: dict[str, tuple[Span, float]] = {}
    taken: list[Span] = []
    loss_as = "loss"
    dicts = _read_dicts(text, fields, spans) if "{" in text else []
    taken.extend(dicts)
    for m in _METRIC.finditer(text):
        if dicts and _overlaps(m.span(), dicts):
            continue  # a key inside a printed dict: read under the dict's name
        value = parse_number(m.group("num"))
        name = _name(m)
        if value is not None and name not in fields:
            scale = _SUFFIX[m.group("sfx").upper()] if m.group("sfx") else 1.0
            fields[name] = value * scale
            spans[name] = m.span("num"), 1.0 / scale
            taken.append(m.span())
            if name == "loss":
                written = _SEPARATORS.sub("_", m.group("loss").strip().lower())
                loss_as = written if written in TRAIN_LOSS_NAMES else "loss"
    found = find_step_match(text)
    taken.append(found.span() if found else (-1, -1))
    t = _TIME.search(text)
    if t:
        taken.append(t.span())
    peak = _PEAK_MEMORY.search(text) if "B)" in text else None
    if peak:
        taken.append(peak.span())
    for m in _PAIR.finditer(text):
        if _overlaps(m.span(), taken):
            continue  # a key the rules read by name, the step, the step time, a printed dict
        if " " in m.group("key") and not _AFTER_SEPARATOR.search(text, 0, m.start()):
            continue  # words in a sentence ("here are a few rewards: [...]"), not a key
        key = _SPACES.sub("_", m.group("key").strip().lower())
        if key in fields:
            continue
        if m.group("num") is not None:
            value = parse_number(m.group("num").replace(",", ""))
            if value is not None:
                fields[key] = value
                spans[key] = m.span("num"), 1.0
        else:
            _spread(key, m.group("list"), fields)
    if not any(_SIGNAL.search(k) for k in fields) and "loss" not in fields:
        return None
    for key in [
        k for k in fields if _PERPLEXITY.match(k) and "loss" not in fields and "eval_loss" not in fields
    ]:
        as_loss = "loss" if _PERPLEXITY.match(key).group("train") else "eval_loss"  # type: ignore[union-attr]
        if as_loss not in fields:
            ppl = fields[key]
            fields[as_loss] = math.log(ppl) if ppl > 0 else math.nan
            spans.pop(key, None)  # a value computed from a number: read by the rules each time
    if t:
        div = 1000.0 if t.group("unit").lower() == "ms" else 1.0
        fields["step_time_s"] = float(t.group("num")) / div
        spans["step_time_s"] = t.span("num"), div
    if peak:  # no span: a number with separators is no one number of the line's template
        fields["mem_peak_bytes"] = (
            float(peak.group("num").replace(",", "")) * _BYTES[peak.group("unit").lower()]
        )
    if dicts:
        fields.update(_means_of_sums(fields))
    step = (step_of(found), step_span(found)) if found else None
    t_value = total_of(found) if found else None
    total = (t_value, step_span(found, total=True)) if found and t_value is not None else None
    return step, total, fields, spans, loss_as, found is not None and redrawn(found)


def _overlaps(span: Span, spans: list[Span]) -> bool:
    return any(a < span[1] and span[0] < b for a, b in spans)


def _read_dicts(text: str, fields: dict[str, float], spans: dict[str, tuple[Span, float]]) -> list[Span]:
    """The numbers of the dicts printed after a key (``reward_data: {'total_reward': 144.0}``), each
    under ``key.inner`` (:mod:`~.inline_dict`), into ``fields``; the spans of the dicts read."""
    read: list[Span] = []
    for m in _DICT_KEY.finditer(text):
        if read and m.start() < read[-1][1]:
            continue  # a dict nested in one read already
        parsed = parse_dict(text, m.end() - 1, _SPACES.sub("_", m.group("key").strip().lower()))
        if parsed is None:
            continue  # not a literal dict: its pairs are read one by one, as on any line
        numbers, end = parsed
        for key, value, span in numbers:
            key = key.lower()
            if key not in fields:
                fields[key] = value
                spans[key] = span, 1.0
        read.append((m.start(), end))
    return read


# A dict that tallies a batch: its count, and its sums (total_reward, sum_loss).
_COUNT = re.compile(r"^(?P<at>.*\.)(?:total_num|num|n|count|total_count|num_samples|n_samples)$")
_SUM = re.compile(r"^(?P<at>.*\.)(?:total|sum)_(?P<what>\w+)$")


def _means_of_sums(fields: dict[str, float]) -> dict[str, float]:
    """The means of a printed dict's sums over its count that ``fields`` lacks
    (``{'total_num': 256, 'total_reward': 144.0}`` holds ``mean_reward`` 0.5625): a sum grows with
    the batch, so runs or restarts of other batch sizes, and a batch cut short, would read as a
    change of the signal itself."""
    counts = {m.group("at"): v for k, v in fields.items() if "." in k and (m := _COUNT.match(k))}
    means: dict[str, float] = {}
    if not counts:
        return means
    for key, value in fields.items():
        m = _SUM.match(key)
        if m is None or _COUNT.match(key):
            continue
        count = counts.get(m.group("at"))
        mean = f"{m.group('at')}mean_{m.group('what')}"
        if count is not None and count > 0 and mean not in fields:
            means[mean] = value / count
    return means


def _spread(key: str, listed: str, fields: dict[str, float]) -> None:
    """A list of per-sample values (``rewards: tensor([1., 0., 1.])``): its mean and its spread."""
    values = [v for v in (parse_number(x) for x in listed.strip("[]").split(",")) if v is not None]
    if not values:
        return
    mean = sum(values) / len(values)
    fields[key] = mean
    fields[f"{key}_std"] = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def _layout(
    parts: list[str],
    step: tuple[int, Span] | None,
    total: tuple[int, Span] | None,
    fields: dict[str, float],
    spans: dict[str, tuple[Span, float]],
    loss_as: str,
    bar: bool,
) -> _Layout | None:
    """The positions of the rules' numbers among the template's, if each is one whole number."""
    read = {k: v for k, v in fields.items() if k in spans}
    means = _means_of_sums(read)
    if len(read) + len(means) != len(fields) or not means.keys() <= fields.keys():
        return None  # a value made of several numbers (a list's mean): read by the rules each time
    if step is None and find_step_match("1".join(parts[0::2])) is not None:
        return None  # "step 1.5" names no step, though "step 2" of the same template does
    index: dict[Span, int] = {}
    pos = 0
    for i, part in enumerate(parts):
        if i % 2:
            index[pos, pos + len(part)] = i // 2
        pos += len(part)
    try:
        return _Layout(
            None if step is None else index[step[1]],
            None if total is None else index[total[1]],
            tuple((name, index[span], div) for name, (span, div) in spans.items()),
            loss_as,
            _shape(fields),
            bar,
            bool(means),
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
    Records that name no step count by their template alone.
    """
    count, best = 0, 0
    runs: dict[tuple[bool, tuple[str, ...]], tuple[int, int]] = {}
    for line in _blocks(head.splitlines()):
        parsed = parse_line(line)
        if parsed is None:
            continue
        count += 1
        shape: tuple[bool, tuple[str, ...]]
        if parsed.step is None:
            shape = (False, (parsed.shape,))
            step = runs.get(shape, (0, 0))[1] + 1
        else:
            shape = (parsed.total is None, tuple(sorted(parsed.fields)))
            step = parsed.step
        run, last = runs.get(shape, (0, step))
        run = run + 1 if step >= last else 1
        runs[shape] = run, step
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


# A line that may name a step without holding a record ("rollout batch 3 generated").
_STEP_WORD = re.compile(r"step|iter|batch", re.IGNORECASE)
# A metric of a block, indented on a line of its own: one key (a few words) and one value.
_BLOCK_LINE = re.compile(r"^[ \t]+[A-Za-z][\w/.@()-]*(?: [\w/.@()-]+){0,4}?\s*[:=]\s*[-+\w.,]+\s*$")
# A block's head: its step's word, an epoch, numbers, brackets and separators, and no other word;
# its end (from the last step word on) is looked at first, on the line before its prefix is stripped.
_HEAD_END = r"(?:global[ _]step|steps?|iter(?:ation)?|batch)[^A-Za-z]*(?:epoch[^A-Za-z]*)?$"
_HEAD_TAIL = re.compile(_HEAD_END, re.IGNORECASE)
_HEAD = re.compile(r"^[^A-Za-z]*" + _HEAD_END, re.IGNORECASE)
_MAX_BLOCK = 256
# A head is its step and a logger's prefix: a longer line (a generation, a dumped config) is none.
_MAX_HEAD = 200


def _block_head(raw: str) -> bool:
    """Whether a line names a step and nothing else (OLMo's ``[step=10/10000,epoch=0]``)."""
    if len(raw) > _MAX_HEAD or "loss" in raw or "Loss" in raw:
        return False
    words = list(_STEP_WORD.finditer(raw))
    if not words or not _HEAD_TAIL.match(raw, words[-1].start()):
        return False
    text = strip_prefix(raw)[1]
    return bool(_HEAD.match(text)) and find_step_match(text) is not None


def _blocks(lines: Iterable[str]) -> Iterator[str]:
    """The lines, a block's metric lines joined onto the line that names its step (two spaces
    apart, so that a key of several words reads as one). Each line waits for the next: only a line
    followed by an indented ``key=value`` one is asked whether it heads a block."""
    before: str | None = None  # the line read last, not given out yet
    held: list[str] = []  # its block's lines, once it heads one
    for raw in lines:
        if before is not None:
            if (
                len(held) < _MAX_BLOCK
                and _BLOCK_LINE.match(raw)
                and (held or (before[:1] not in (" ", "\t") and _block_head(before)))
            ):
                held.append(raw.strip())
                continue
            yield "  ".join([before.rstrip("\r\n"), *held]) if held else before
            held = []
        before = raw
    if before is not None:
        yield "  ".join([before.rstrip("\r\n"), *held]) if held else before


Named = list[tuple[str, int]]  # (the line's template, the step it names), in file order


def _parsed(f: Iterable[str]) -> tuple[list[Line], Named]:
    """The records, and the lines that name a step and hold nothing else this reader reads."""
    iters = IterSteps()
    out: list[Line] = []
    named: Named = []
    for raw in _blocks(f):
        line = parse_line(raw)
        if line is not None:
            if (beta := beta_of(raw)) is not None:
                line = line._replace(smoothed=beta)
            if line.step is None:
                line = line._replace(seen=len(named))
            out.append(iters.step(raw, line))
            if len(out) > series.MAX_RECORDS:  # held whole until placed: bounded as the builder is
                raise series.too_many_steps()
        elif _STEP_WORD.search(raw):
            text = strip_prefix(raw)[1]
            found = find_step_match(text)
            if found is not None and not redrawn(found):
                named.append(("#".join(_TOKEN.split(text)[0::2]), step_of(found)))
                if len(named) > series.MAX_RECORDS:
                    raise series.too_many_steps()
    return out, named


def _placed(lines: list[Line], named: Named) -> list[Line]:
    """Records that name no step given one (see the module docstring); those that cannot, left out.

    Where no record names a step, the stepless line that comes back most often is the record of a
    step: at the step its loop's own counter line named last (:func:`_counted`), else numbered
    (:func:`~.text_steps.number_stepless`); the others are placed after it as after a line that
    names its step.
    """
    counts = Counter(r.shape for r in lines if r.step is None)
    if not counts:
        return lines
    if all(r.step is None for r in lines):
        main, n = counts.most_common(1)[0]
        if n < MIN_RECORDS:
            return []  # no line comes back: prose, not a log
        records = [r for r in lines if r.shape == main]
        counted = _counted(records, named)
        stepped = iter(counted if counted is not None else number_stepless(records))
        lines = [next(stepped) if r.shape == main else r for r in lines]
    stepped_keys = {k for r in lines if r.step is not None for k in r.fields}
    out: list[Line] = []
    last: int | None = None
    for r in lines:
        if r.step is not None:
            last = r.step
            out.append(r)
        elif last is not None and counts[r.shape] >= MIN_RECORDS and not stepped_keys & set(r.fields):
            out.append(r._replace(step=last))
    return out


def _counted(records: list[Line], named: Named) -> list[Line] | None:
    """Records at the step their loop's counter line named last (``rollout batch 3 generated``,
    ``GRPO Iteration: 3 ... Microbatch: 7 / 128``), where a log prints its step on a line of its
    own: the template among those lines that comes back most often, when it names at least a
    quarter as many steps as there are records (a counter printed every ten records is too
    coarse: they are numbered instead). Records before its first line have no step yet: 0 where it counts from
    0 or 1. None when there is no such line."""
    templates = Counter(t for t, _ in named)
    if not templates:
        return None
    template, n = templates.most_common(1)[0]
    steps = [step for t, step in named if t == template]
    if n < MIN_RECORDS or 4 * len(set(steps)) < len(records):
        return None
    last: list[int | None] = [None]
    for t, step in named:
        last.append(step if t == template else last[-1])
    first = min(steps)
    return [r._replace(step=last[r.seen] if last[r.seen] is not None else min(first, 0)) for r in records]


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


def _last_drawings(lines: list[Line]) -> list[Line]:
    """Of a progress bar's drawings of one step in a row, the last: tqdm redraws its postfix (the
    loss) as it changes, before its count moves on, so a step's earlier drawings are the step
    before's values, not sub-batches of it."""
    if not any(r.redrawn for r in lines):
        return lines
    out: list[Line] = []
    for r in lines:
        if out and r.redrawn and out[-1].redrawn and out[-1].step == r.step and out[-1].rank == r.rank:
            out[-1] = r
        else:
            out.append(r)
    return out


def _logged_every(lines: list[Line]) -> list[Line]:
    """A bar whose postfix holds a value logged every k steps: the steps it was logged at.

    A script that calls ``set_postfix(loss=...)`` every ``logging_steps`` leaves the value in the
    bar while the count runs on: each step in between draws it again. Where every change of the
    values after the first drawing falls k steps after the one before (10, 20, 30..., or 9, 19,
    29... when the script counts from 0), the drawings in between repeat the value logged last,
    and only the steps at that phase are records. A postfix updated every step changes at steps
    one apart, and is kept whole.
    """
    drawn = [r for r in lines if r.redrawn and r.step is not None]
    if len(drawn) < 2 * MIN_RECORDS:
        return lines
    changes: list[int] = []
    prev: dict[str, float] | None = None
    for r in drawn:
        values = {k: v for k, v in r.fields.items() if k != "step_time_s"}
        if prev is not None and values != prev:
            changes.append(r.step or 0)
        prev = values
    every = 0
    for a, b in itertools.pairwise(changes):
        every = math.gcd(every, b - a)
    if len(changes) < MIN_RECORDS or every < 2:
        return lines
    phase = changes[0] % every
    return [r for r in lines if not r.redrawn or r.step is None or r.step % every == phase]


def _debiased(lines: list[Line]) -> list[Line]:
    """Lines whose loss is a running average (:mod:`.smoothed`), its known start-up bias divided out."""
    at = [i for i, r in enumerate(lines) if r.smoothed and r.step is not None and "loss" in r.fields]
    if not at:
        return lines
    out = list(lines)
    for beta in {lines[i].smoothed for i in at}:
        mine = [i for i in at if lines[i].smoothed == beta]
        fixed = debiased(((lines[i].step or 0, lines[i].fields["loss"]) for i in mine), beta)
        for i, loss in zip(mine, fixed, strict=True):
            if loss != lines[i].fields["loss"]:
                out[i] = lines[i]._replace(fields={**lines[i].fields, "loss": loss})
    return out


def read(path: Path) -> Series:
    with open_lines(path) as read_lines:
        records, named = _parsed(read_lines)
    records = _debiased(records)
    lines = _evaluation_estimates(_placed(_logged_every(_last_drawings(records)), named))
    b = SeriesBuilder(str(path), FORMAT, in_order=True)
    ranks = LowestRank(b)
    for line in epoch_steps(lines):
        step = line.step
        if step is not None and ranks.accept(step, line.rank):
            fields = line.fields
            if line.loss_as != "loss" and "loss" in fields:  # the builder decides which is the loss
                fields = {line.loss_as if k == "loss" else k: v for k, v in fields.items()}
            b.add_numbers(step, fields)
    if len(b) < MIN_RECORDS:
        raise UnreadableLog(f"fewer than {MIN_RECORDS} steps with a loss; looked for lines with {LOOKED_FOR}")
    b.notes += read_lines.notes()
    return b.build(require=("loss", "eval_loss"))


# The catch-all, tried last.
LOG_FORMAT = LogFormat(FORMAT, order=1000, read=read, sniff_text=sniff)

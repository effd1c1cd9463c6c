"""Logs whose records are dicts printed on a line: what most trainers write to stdout.

Examples of what is read::

    {'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 2e-05, 'epoch': 0.1}           HF Trainer, axolotl
    {'loss': '0.0001', 'reward': '0.24', 'kl': '0.001', 'epoch': '0.02'}              TRL (numbers as strings)
     25%|██▌       | 5/20 [00:03<00:09, 1.6it/s]{'loss': 2.3, ...}                    after a progress bar
    [rank0]: {'eval_loss': 2.1, 'eval_runtime': 3.2, 'epoch': 1.0}                  an evaluation
    2024-05-01 12:00:05 | INFO | train_inner | {"epoch": 1, "num_updates": "5", "loss": "7.9"}   fairseq
    step:12 - actor/pg_loss:0.009 - actor/kl_loss:0.001 - actor/grad_norm:3.7 - critic/score/mean:0.21   verl

The rules:

- A record is a ``{...}`` at the end of a line (after its launcher/logger prefix and any
  progress bar drawn on the same line with ``\\r``), Python or JSON, holding a ``loss``,
  ``train_loss`` or ``eval_loss``; numbers written as strings are numbers. verl's console
  logger writes its dict as ``step:N - key:value - key:value``; its policy loss
  (``actor/pg_loss``) and grad norm are read as the loss and the grad norm (series.ALIASES).
- The step is the dict's own (:data:`STEP_KEYS`), else a ``step N`` the line names before
  it. The HF Trainer prints none: its k-th dict is at ``k * logging_steps``, the interval
  the log states before its first dict (axolotl prints its config: ``"logging_steps": 2,``),
  else taken from a finished run's total steps (the bar's ``/20``) over its dicts, else from the
  bar's counts, which never run ahead of the dict that follows them when the two reach the
  file in order (:func:`_logging_interval`). The bar's count itself is no step: tqdm redraws
  at most ten times a second, and with stdout buffered the dicts land after the bar has run on.
- An evaluation (``eval_loss`` without ``loss``) belongs to the step last logged; the
  Trainer's closing summary (``train_runtime``) is not a step.
- The file is this format when :data:`MIN_RECORDS` such lines are among its first.

The supervisor reads a running tool's stdout with the same functions
(:mod:`steadytune.supervise.log_adapter`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from steadytune.importers.format import LogFormat
from steadytune.importers.lines import open_lines
from steadytune.importers.prefix import LowestRank, strip_ansi, strip_prefix
from steadytune.importers.series import ALIASES, Series, SeriesBuilder, UnreadableLog, is_summary
from steadytune.importers.text_steps import find_step

FORMAT = "dict_log"
MIN_RECORDS = 3
STEP_KEYS = ("step", "global_step", "num_updates", "iteration", "iter", "current_steps")
LOOKED_FOR = "lines ending in a dict with a loss ({'loss': 2.3, ...} or {\"loss\": 2.3, ...})"

# verl's console logger: "step:1 - actor/pg_loss:0.009 - actor/grad_norm:3.7 - ..." (no braces); its
# values may be numpy's reprs (np.float64(0.0)), and a terminal capture may cut the line short.
_KV_START = re.compile(r"^step:\s*(\d+)\s+-\s+")
_KV_VALUE = re.compile(
    r"^(?:np\.\w+\(|tensor\(|float\()?\s*([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|nan|inf))\)?$"
)
_LOG_DICT = re.compile(r"""(\{[^{}]*['"](?:loss|train_loss|eval_loss)['"][^{}]*\})\s*$""")
_SUMMARY_START = re.compile(r"""\{\s*['"]train_runtime['"]\s*:""")
_ANY_DICT = re.compile(r"""\{[^{}]*['"](?:loss|train_loss|eval_loss)['"][^{}]*\}""")
# ms-swift prints its step as a string beside the total: 'global_step/max_steps': '10/100'.
_SWIFT_STEP = re.compile(r"""['"]global_step/max_steps['"]\s*:\s*['"](\d+)/(\d+)['"]""")
# The logging interval where the log states it: axolotl prints its config as JSON at the start
# ('"logging_steps": 2,'), a script may print its TrainingArguments ('logging_steps=2,').
_DECLARED_EVERY = re.compile(
    r"""^\s*["']?logging_steps["']?\s*[:=]\s*(\d+)\s*,?\s*$|\blogging_steps=(\d+),"""
)
# The Trainer's own progress bar has no description: "  25%|██▌       | 5/20 [00:00<00:00, 17.94it/s]".
_TRAIN_BAR = re.compile(r"^\s*\d{1,3}%\|[^|]*\|\s*(\d+)/(\d+)\s*\[[^\]]*(?:it/s|s/it)")
_ANY_BAR = re.compile(r"\d{1,3}%\|[^|]*\|\s*(\d+)/(\d+)\s*\[[^\]]*(?:it/s|s/it)[^\]]*\]")
# 'key': value in a flat dict; the value quoted or not (TRL and transformers 5 print numbers as
# strings; Python prints nan and inf bare, JSON NaN and Infinity).
_PAIR = re.compile(
    r"""(['"])((?:(?!\1).)+)\1\s*:\s*(['"]?)"""
    r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf(?:inity)?|NaN|Infinity))"
    r"\3\s*(?=[,}])"
)


def segments(line: str) -> list[str]:
    """What a terminal would show of each carriage-return-separated part, escape codes removed.

    A tqdm bar rewrites its line with ``\\r`` and no newline, so when stdout and stderr
    share a pipe the next log dict lands at the end of the bar's line.
    """
    return strip_ansi(line).replace("\r\n", "\n").split("\r")


def _numbers(text: str) -> dict[str, float]:
    """The ``'key': number`` pairs of a flat dict as Python or JSON prints it; other values skipped.

    Read by pattern, not evaluated: nothing in a log is ever run, and a 100,000-line stdout
    reads several times faster than through ``ast.literal_eval``.
    """
    out: dict[str, float] = {}
    for m in _PAIR.finditer(text):
        try:
            out[m.group(2)] = float(m.group(4))
        except (ValueError, OverflowError):
            continue
    return out


def _kv_line(line: str) -> dict[str, float] | None:
    """The numbers of a ``step:N - key:value - ...`` line (verl); None if it is not one."""
    if "step:" not in line[:120]:
        return None
    text = strip_prefix(line)[1]
    m = _KV_START.match(text)
    if m is None:
        return None
    out: dict[str, float] = {"step": float(m.group(1))}
    for pair in text[m.end() :].split(" - "):
        key, sep, raw = pair.strip().rpartition(":")
        value = _KV_VALUE.match(raw.strip()) if sep and key and " " not in key else None
        if value is not None:  # a pair the capture cut short is left out
            out[key] = float(value.group(1))
    return out if len(out) > 1 else None


def parse_log_line(line: str) -> dict[str, float] | None:
    """The numbers of a log dict a line ends with (strings that are numbers too); None if none."""
    m = None
    for part in reversed(segments(line)):
        m = _LOG_DICT.search(part)
        if m:
            break
    if not m:
        return None
    values = _numbers(m.group(1))
    swift = swift_progress(m.group(1))
    if swift:
        values["global_step"] = float(swift[0])
    return values or None


def swift_progress(text: str) -> tuple[int, int] | None:
    """(step, total steps) of an ms-swift log dict (``'global_step/max_steps': '10/100'``); None if none."""
    if "global_step/max_steps" not in text:
        return None
    m = _SWIFT_STEP.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def train_bar(line: str) -> tuple[int, int] | None:
    """(steps done, total steps) from the last reading of the Trainer's progress bar in a line."""
    for part in reversed(segments(line)):
        m = _TRAIN_BAR.match(part)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def _last_bar(line: str) -> tuple[int, int] | None:
    """(count, total) of the last progress-bar reading anywhere in a line (bars redrawn without ``\\r``)."""
    found = None
    for part in segments(line):
        for m in _ANY_BAR.finditer(part):
            found = int(m.group(1)), int(m.group(2))
    return found


def own_step(values: dict[str, float]) -> int | None:
    for key in STEP_KEYS:
        v = values.get(key)
        if v is not None and v == v and float(v).is_integer():
            return int(v)
    return None


def _text_step(line: str) -> int | None:
    """A ``step N`` the line names before its dict (a script that prints both); a progress bar
    drawn before it is not one (its count lags or, with stdout buffered, runs ahead)."""
    if "{" not in line:
        return None
    found = find_step(strip_prefix(_ANY_BAR.sub("", line[: line.rfind("{")]))[1])
    return found[0] if found else None


class _Row(NamedTuple):
    rank: int | None
    step: int | None  # the dict's own, or the line's; None: the Trainer's, which prints none
    bar: int | None  # the progress bar's count last seen before it
    total: int | None  # and that bar's total (the run's steps, for the training bar)
    values: dict[str, float]
    run: int = 0  # which run of the file (a Trainer's stdout may hold several, one after another)


def _logging_interval(rows: list[_Row], finished: bool, declared: int | None = None) -> int:
    """Steps between two printed train dicts, for a Trainer that prints no step of its own.

    The Trainer prints a dict every ``logging_steps`` steps: the interval the log states, where it
    states one (``declared``). A run that finished printed
    ``total // logging_steps`` of them, which gives the interval exactly. Otherwise the
    progress bar's count is the clue: it is never past the step whose dict follows it when the
    bar and the dicts reach the file in order, so the k-th dict's count c gives ``interval >=
    c / k``, rounded up (an interval is whole). tqdm redraws at most ten times a second, so a
    fast run's bar lags, but ``tqdm.write`` redraws it right after each dict, at that dict's step:
    the k-th dict follows a count of at least ``(k - 1) * interval``, whose ceiling over k is the
    interval itself once k passes it. Rounded down, a bar one step behind every dict (counts 1, 3,
    5, 7, 9 before the dicts of steps 2, 4, 6, 8, 10) read as an interval of 1.
    """
    train = [r for r in rows if r.step is None and "loss" in r.values]
    if not train:
        return 1
    if declared:
        return declared
    total = train[-1].total  # the bar before the last dict; later bars are other work (saving)
    if finished and total:
        return max(1, total // len(train))
    ratios = [-(-r.bar // k) for k, r in enumerate(train, 1) if r.bar]
    return max(1, max(ratios, default=1))


def _another_run(rows: list[_Row], values: dict[str, float], closed: float | None) -> bool:
    """Whether a dict that names no step starts another run of the Trainer after ``rows``.

    A Trainer's stdout names no step, so a second run appended to the file (a script that trains
    twice, a run started again into the same ``nohup.out``) shows only in what it prints: after
    the closing summary of the run before (``closed``: the epoch that run reached), a train dict,
    or an evaluation at an earlier epoch (``trainer.evaluate()`` after training is at the same
    one); without a summary (a run killed), an epoch lower than the dict before it had.
    """
    if not rows or rows[-1].step is not None:
        return False
    epoch = values.get("epoch")
    if closed is not None:
        return "loss" in values or (epoch is not None and epoch < closed)
    before = rows[-1].values.get("epoch")
    return epoch is not None and before is not None and epoch < before


def _closed_at(rows: list[_Row], run: int, epoch: float | None = None) -> float | None:
    """The epoch a run its closing summary ends reached; None for a run that logged nothing (a
    training whose every step fell between two logs: what follows is still its file's first run)."""
    reached = [r.values.get("epoch", 0.0) for r in rows if r.run == run]
    return max(epoch or 0.0, *reached) if reached else None


def _records(lines: Iterable[str]) -> list[tuple[int | None, int, dict[str, float], int]]:
    rows: list[_Row] = []
    bar: tuple[int, int] | None = None
    finished: set[int] = set()  # the runs whose closing summary was seen
    closed: float | None = None  # the epoch the last run closed at, until another run starts
    run = 0
    declared: int | None = None
    for line in lines:
        if declared is None and not rows and "logging_steps" in line:
            m = _DECLARED_EVERY.search(line)
            if m:
                declared = int(m.group(1) or m.group(2)) or None
        if "train_runtime" in line and run not in finished and _SUMMARY_START.search(line):
            finished.add(run)  # also a summary the capture broke in two
            closed = _closed_at(rows, run)
        if "{" not in line:
            values = _kv_line(line)
            if values is None:
                if "it/s" in line or "s/it" in line:
                    bar = _last_bar(line) or bar
                continue
            found = [(bar, values)]
        else:
            found = _line_dicts(line, bar)
            if not found:
                continue
        for bar, values in found:
            values = {ALIASES.get(k, k): v for k, v in values.items()}
            step = own_step(values)
            if is_summary(values) and ("train_runtime" in values or step is None):
                # the closing summary: its train_loss is the run's mean
                if run not in finished:
                    finished.add(run)
                    closed = _closed_at(rows, run, values.get("epoch"))
                continue
            if "train_loss" in values and "loss" not in values:
                values["loss"] = values.pop("train_loss")  # a script's own dict, with its step
            if "loss" not in values and "eval_loss" not in values:
                continue
            if step is None:
                step = _text_step(line)
            if step is None and _another_run(rows, values, closed):
                run, closed = run + 1, None
            count, total = bar if bar else (None, None)
            rows.append(_Row(strip_prefix(line)[0], step, count, total, values, run))
        if "{" in line and ("it/s" in line or "s/it" in line):
            bar = _last_bar(line[line.rfind("}") :]) or bar
    return _stepped(rows, finished, declared)


def _line_dicts(
    line: str, bar: tuple[int, int] | None
) -> list[tuple[tuple[int, int] | None, dict[str, float]]]:
    """Each log dict of a line with the bar reading last drawn before it.

    A capture that turned the bar's ``\\r`` into nothing has the Trainer's dicts in the middle
    of one long line of bar drawings (``9/472 [..]{'loss': 0.99, ...}  2%|▏| 10/472 [..]``).
    """
    text = strip_ansi(line)
    out: list[tuple[tuple[int, int] | None, dict[str, float]]] = []
    start = 0
    for m in _ANY_DICT.finditer(text):
        bar = _last_bar(text[start : m.start()]) or bar
        start = m.end()
        values = _numbers(m.group(0))
        swift = swift_progress(m.group(0))
        if swift:
            values["global_step"] = float(swift[0])
        if values:
            out.append((bar, values))
    return out


def _stepped(
    rows: list[_Row], finished: set[int], declared: int | None = None
) -> list[tuple[int | None, int, dict[str, float], int]]:
    """Each row with its step and run: its own step, else the k-th train dict's ``k * interval``,
    counted in its run; an evaluation (no ``loss``) belongs to the step logged before it, or,
    before the run's first train dict (an epoch's evaluation when the Trainer logs less often
    than an epoch), to its epoch's step, where the run's bar and epochs give its steps per epoch."""
    out = []
    for run, group in itertools.groupby(rows, key=lambda r: r.run):
        runs_rows = list(group)
        every = _logging_interval(runs_rows, run in finished, declared)
        per_epoch = _steps_per_epoch(runs_rows) if run in finished else None
        last = k = 0
        for r in runs_rows:
            step = r.step
            if step is None:
                epoch = r.values.get("epoch")
                if "loss" in r.values:
                    k += 1
                    step = k * every
                elif k == 0 and per_epoch and epoch is not None:
                    step = round(epoch * per_epoch)
                else:
                    step = last
            last = step
            out.append((r.rank, step, r.values, run))
    return out


def _steps_per_epoch(rows: list[_Row]) -> float | None:
    """A finished run's steps over the epochs it reached: its training bar's total over its last
    epoch (None where either is unknown)."""
    train = [r for r in rows if r.step is None and "loss" in r.values]
    total = train[-1].total if train else None
    epochs = max((r.values.get("epoch", 0.0) for r in rows), default=0.0)
    return total / epochs if total and epochs > 0 else None


def sniff(head: str) -> bool:
    count = 0
    for line in head.splitlines()[:2000]:
        if "loss" in line:
            found = [v for _, v in _line_dicts(line, None)] if "{" in line else [_kv_line(line)]
            count += sum(1 for values in found if values is not None and not is_summary(values))
            if count >= MIN_RECORDS:
                return True
    return False


def read(path: Path) -> Series:
    with open_lines(path) as lines:
        # A form feed or a U+2028 inside a line ends it too, as str.splitlines() has it.
        rows = _records(part for line in lines for part in line.splitlines())
    if len(rows) < MIN_RECORDS:
        raise UnreadableLog(f"fewer than {MIN_RECORDS} {LOOKED_FOR}")
    b = SeriesBuilder(str(path), FORMAT, in_order=True)
    ranks = LowestRank(b)
    current = 0
    for rank, step, values, run in rows:
        if run != current:
            b.new_run()
            ranks, current = LowestRank(b), run
        if ranks.accept(step, rank):
            b.add_numbers(step, {k: v for k, v in values.items() if k not in STEP_KEYS})
    b.notes += lines.notes()
    return b.build(require=("loss", "eval_loss"))


# Printed Python dicts start with "{" too: tried with the JSON layouts when the first line is no JSON.
LOG_FORMAT = LogFormat(
    FORMAT,
    order=130,
    read=read,
    sniff_json_head=lambda head, first: first is None and sniff(head),
    sniff_text=sniff,
    parse_line=parse_log_line,
)

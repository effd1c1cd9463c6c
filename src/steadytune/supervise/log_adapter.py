"""Turns what a tool prints and writes into the run's telemetry, as a native worker would.

A command steadytune does not run writes no step records. What it does write:
HF-style log dicts on stdout (``{'loss': 1.2, 'grad_norm': 3.4, 'learning_rate': 2e-05,
'epoch': 0.5}``, TRL's with string numbers and a tqdm bar on the same line),
LLaMA-Factory's ``trainer_log.jsonl`` with real step numbers, and the
``trainer_state.json`` of each checkpoint. A script's own text lines that name a step
and a loss (``step 12 | loss 2.3 | lr 2e-05``) are read by the rules ``analyze`` reads
text logs by (:mod:`steadytune.importers.text_log`), while the job prints no log dict.
The adapter translates those into
``StepRecord``\\s, ``Heartbeat``\\s and a ``train_begin`` event in
``telemetry/rank-0.jsonl``; the supervisor then reads that stream exactly as it
reads a native worker's. The adapter decides nothing.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from steadytune.checkpoint.manifest import checkpoint_step
from steadytune.importers import llamafactory, text_log
from steadytune.importers.series import TRAIN_LOSS_NAMES, LossChoice
from steadytune.protocol import WorkerEvent
from steadytune.records import RECORD_LOG_KEYS, Event, Heartbeat, StepRecord, logged_extra
from steadytune.supervise.logparse import (
    FOLLOWED,
    STEP_KEYS,
    is_summary,
    logging_steps_from,
    own_step,
    parse_log_line,
    swift_progress,
    train_bar,
)
from steadytune.telemetry.jsonl import JsonlReader
from steadytune.telemetry.stream import JsonlWriter

HEARTBEAT_EVERY_S = 1.0  # output is proof of life; more than one beat a second says nothing new
# Output this long with no step read: the job's format is likely not one followed (a model still
# loading prints for a while too, so the warning says both).
NO_STEPS_WARN_S = 120.0
_JOINED = ("grad_norm", "num_tokens")  # what a trainer_log.jsonl row lacks of the fields


class LogAdapter:
    """One attempt's translation of a command's output into step records (rank 0)."""

    def __init__(
        self,
        writer: JsonlWriter,
        command: Sequence[str],
        output_dir: Path | None,
        clock: Callable[[], float],
    ) -> None:
        self.writer, self.output_dir, self.clock = writer, output_dir, clock
        self.attempt = 0
        self.records = True  # False while an injected guard writes the records itself
        self._lock = threading.Lock()
        # HF prints a dict every logging_steps: read from the command (or its YAML), later from a
        # checkpoint's trainer_state.json; unknown, the progress bar's count stands in.
        self._log_every: int | None = logging_steps_from(command)
        self._log_step = 0
        self._last_logged_step = 0
        self._last_record_ts: float | None = None
        self._last_beat = 0.0
        self._bar_step: int | None = None
        self._max_steps: int | None = None
        self._printed: dict[int, dict[str, float]] = {}
        self._rows: dict[int, dict[str, float]] = {}  # trainer_log.jsonl rows waiting for their dict
        self._recorded: set[int] = set()  # steps recorded in this attempt
        self._dicts_seen = False  # the tool prints log dicts beside its trainer_log.jsonl
        self._tokens_seen: float | None = None  # the tool's cumulative token count at the last record
        self._log_reader: JsonlReader | None = None
        self._log_id: tuple[int, int] | None = None
        # A trainer_log.jsonl already there holds an earlier run's rows, not this run's steps: a
        # command run again that resumes by itself appends to it (its first row then shows where it
        # resumed), and a fresh start replaces it (another file, read from the top).
        self._earlier_log = _file_end(output_dir / "trainer_log.jsonl") if output_dir else None
        self._real_steps = False  # trainer_log.jsonl seen in this attempt: it stays, stop asking
        self._finished = False  # the attempt printed the Trainer's closing summary
        # Which of the loss-like fields is the loss (series.LossChoice, as analyze decides it).
        self._losses = LossChoice()
        self._told: set[str] = set()  # the ignored fields already said
        self.last_line = ""
        self.peak_lr: float | None = None  # the highest LR this attempt logged with a training loss
        self._dicts_printed = False  # the job prints log dicts: its text lines are not its steps
        self._output_since: float | None = None  # this attempt's first line of output
        self.ever_stepped = False  # a step was read from the job, in any attempt
        self._warned_no_steps = False

    # -- attempts -------------------------------------------------------------
    def begin(self, attempt: int, checkpoint: Path | None) -> None:
        """A new attempt: counters continue from the checkpoint it resumes (or start over)."""
        with self._lock:
            self.attempt = attempt
            self._real_steps = False
            self._finished = False
            self._recorded.clear()
            self._printed.clear()
            self._rows.clear()
            self._last_record_ts = None
            self._tokens_seen = None  # a new process counts its tokens from zero
            self._max_steps = None
            self.peak_lr = None
            self._output_since = None
            if checkpoint is None:
                self._log_step = self._last_logged_step = 0
                return
            try:
                state = json.loads((checkpoint / "trainer_state.json").read_text())
            except (OSError, ValueError):
                state = {}
            self._log_every = int(state.get("logging_steps") or 0) or self._log_every
            self._log_step = int(state.get("global_step") or checkpoint_step(checkpoint) or 0)
            self._last_logged_step = self._log_step

    def steps_are_real(self) -> bool:
        """Steps come from the tool's own counter (trainer_log.jsonl), not from counting its log lines."""
        if not self._real_steps and self.output_dir is not None:
            self._real_steps = (self.output_dir / "trainer_log.jsonl").exists()
        return self._real_steps

    # -- stdout ---------------------------------------------------------------
    def on_stdout(self, line: str) -> None:
        self.last_line = line
        self._beat()
        self._no_steps_yet()
        bar = train_bar(line)
        if bar is not None and bar[1] > 0:
            self._total(bar[1])
            self._bar_step = bar[0]
        values = parse_log_line(line)
        if values is not None and is_summary(values):
            self._finished = True  # the Trainer's closing summary: what follows is winding down
            self._beat(force=True)
            return
        if values is None:
            self._text_line(line)
            return
        self._dicts_printed = True
        # ms-swift's dicts name their step and the run's length ('global_step/max_steps': '10/100'); its
        # progress bar has a description, which is not the Trainer's own bar, and it logs step 1 as well.
        own = own_step(values)
        if own is not None:
            values = {k: v for k, v in values.items() if k not in STEP_KEYS}
            progress = swift_progress(line)
            if progress and progress[1] > 0:
                self._total(progress[1])
        real = self.steps_are_real()
        if real and "loss" in values and self._log_every is not None:
            # LLaMA-Factory's trainer_log.jsonl has the real steps but no grad norm; the dict it
            # printed for the same step has it, and joins the record when the file catches up.
            with self._lock:
                self._log_step += self._log_every
                self._printed[self._log_step] = values
                self._dicts_seen = True
                while len(self._printed) > 256:
                    del self._printed[next(iter(self._printed))]
            return
        if real:
            return
        if "loss" not in values:
            pass  # an evaluation: it belongs to the step just logged
        elif own is not None:
            self._log_step = own
        elif self._log_every is not None:
            self._log_step += self._log_every
        else:
            # The HF Trainer moves its bar on at the step's end and prints the step's dict after:
            # a bar redrawn in between shows the step itself, a stale one an earlier count.
            self._log_step = max(self._log_step + 1, self._bar_step or 0)
        self.record(self._log_step, values)

    def _text_line(self, line: str) -> None:
        """A script's own text line (``step 12 | loss 2.3``): a step where it names one and a loss."""
        if self._dicts_printed or self.steps_are_real():
            return
        parsed = text_log.parse_line(line.rstrip("\n"))
        if (
            parsed is None
            or parsed.step is None
            or "loss" not in parsed.fields
            or parsed.rank not in (None, 0)
        ):
            return
        if parsed.step in self._recorded:
            return  # a progress bar redrawn at the same step
        if parsed.total:
            self._total(parsed.total)
        self._log_step = parsed.step
        self.record(parsed.step, parsed.fields)

    def _no_steps_yet(self) -> None:
        """Warn once when the job has printed for a while and no step was read from it."""
        now = self.clock()
        if self._output_since is None:
            self._output_since = now
        if (
            self._warned_no_steps
            or self.ever_stepped
            or not self.records
            or now - self._output_since < NO_STEPS_WARN_S
        ):
            return
        self._warned_no_steps = True
        self.writer.write(
            Event(
                ts=now,
                kind="lifecycle",
                name=WorkerEvent.NO_STEPS_READ,
                message=f"read no training steps from the job's output in {now - self._output_since:.0f} s "
                f"(still loading, or a format not followed: those followed are {FOLLOWED}); without steps "
                "there is no progress, no detection and no rollback. See docs/recovery.md#supervising-a-"
                "command-steadytune-does-not-run, or give --inject",
                severity="warning",
            )
        )

    def _beat(self, force: bool = False) -> None:
        now = self.clock()
        if (now - self._last_beat < HEARTBEAT_EVERY_S and not force) or not self.records:
            return
        self._last_beat = now
        phase = "finish" if self._finished else "train" if self._last_record_ts is not None else "setup"
        self.writer.write(Heartbeat(ts=now, step=self._last_logged_step, attempt=self.attempt, phase=phase))

    def _total(self, total: int) -> None:
        if total != self._max_steps and self.records:
            self._max_steps = total
            self.writer.write(
                Event(
                    ts=self.clock(),
                    kind="lifecycle",
                    name=WorkerEvent.TRAIN_BEGIN,
                    message=f"the job trains to step {total}",
                    data={"max_steps": total, "attempt": self.attempt},
                )
            )

    # -- files ----------------------------------------------------------------
    def poll_files(self) -> None:
        """LLaMA-Factory's trainer_log.jsonl carries real step numbers: prefer it when present."""
        if self.output_dir is None:
            return
        path = self.output_dir / "trainer_log.jsonl"
        try:
            st = path.stat()
        except OSError:
            return
        if (
            self._log_reader is None
            or (st.st_ino, st.st_dev) != self._log_id
            or st.st_size < self._log_reader.offset
        ):
            # A fresh start (LLaMA-Factory's overwrite_output_dir) replaces the file: read it from the top.
            earlier = self._earlier_log
            start = (
                earlier[2]
                if self._log_reader is None
                and earlier
                and earlier == (st.st_ino, st.st_dev, earlier[2])
                and st.st_size >= earlier[2]
                else 0
            )
            self._log_reader, self._log_id = JsonlReader(path, start), (st.st_ino, st.st_dev)
        for row in self._log_reader.dicts():
            parsed = llamafactory.parse_row(row)
            if parsed is not None:
                self._from_log_file(*parsed)

    def _from_log_file(self, step: int, values: dict[str, float]) -> None:
        """A trainer_log.jsonl row: recorded once the dict printed for its step has joined it.

        The file and stdout race each other; a row waits until its printed dict has come,
        or a later row has (then none will), or the attempt ends (:meth:`drain`).
        """
        self._rows[step] = values
        if not self._dicts_seen:  # the tool prints no log dicts: nothing to wait for
            self.drain()
            return
        for s in sorted(self._rows):
            if s in self._printed or s < step:
                self._record_row(s, self._rows.pop(s))

    def drain(self) -> None:
        """Record every row still waiting for its printed dict (the attempt ended)."""
        for s in sorted(self._rows):
            self._record_row(s, self._rows.pop(s))

    def _record_row(self, step: int, values: dict[str, float]) -> None:
        if step not in self._recorded:  # recorded from stdout before the file existed
            self.record(step, values)

    # -- records --------------------------------------------------------------
    def _interval_tokens(self, total: float | None) -> int | None:
        """Tokens trained since the last record, from a cumulative count (TRL's num_tokens)."""
        if total is None:
            return None
        prev, self._tokens_seen = self._tokens_seen, total
        if prev is None or total < prev:
            return None
        return int(total - prev) or None

    def record(self, step: int, values: dict[str, float]) -> None:
        with self._lock:
            now = self.clock()
            printed = self._printed.pop(step, None)
            if printed:
                # The row's own loss, LR and epoch stand; the dict adds the grad norm, tokens and the rest.
                joined = {k: v for k, v in printed.items() if k in _JOINED or k not in RECORD_LOG_KEYS}
                values = {**joined, **values}
            total = values.get("total_steps")  # LLaMA-Factory's trainer_log.jsonl says how far it goes
            if total and total > 0:
                self._total(int(total))
            # Logs come every few steps: per-step time and tokens are the interval's, shared out.
            steps_since = step - self._last_logged_step if step > self._last_logged_step else 0
            step_time = None
            if steps_since and self._last_record_ts is not None and "loss" in values:
                step_time = (now - self._last_record_ts) / steps_since
            tokens = self._interval_tokens(values.get("num_tokens")) if "loss" in values else None
            if tokens is not None and steps_since:
                tokens //= steps_since
            lr = values.get("learning_rate", values.get("lr"))
            if "loss" in values:
                self.ever_stepped = True
                if lr is not None and math.isfinite(lr):
                    self.peak_lr = lr if self.peak_lr is None else max(self.peak_lr, lr)
                self._last_logged_step = max(self._last_logged_step, step)
                self._recorded.add(step)
                self._last_record_ts = now
            if not self.records:
                return
            loss = self._loss(values, now)
            self.writer.write(
                StepRecord(
                    step=step,
                    ts=now,
                    attempt=self.attempt,
                    loss=loss,
                    grad_norm=values.get("grad_norm"),
                    lr=lr,
                    epoch=values.get("epoch"),
                    eval_loss=values.get("eval_loss"),
                    tokens=tokens or None,
                    step_time_s=step_time,
                    extra=_extra(values),
                )
            )

    def _loss(self, values: dict[str, float], now: float) -> float | None:
        """The record's training loss, by the rule analyze uses; an artefact found is said once."""
        for name in TRAIN_LOSS_NAMES:
            if name in values:
                self._losses.see(name, values[name])
        chosen = self._losses.chosen()
        for name, note in self._losses.notes().items():
            if name not in self._told:
                self._told.add(name)
                self.writer.write(
                    Event(ts=now, kind="lifecycle", name=WorkerEvent.LOSS_FIELD_IGNORED, message=note)
                )
        if not self._losses.settled:
            return None  # two loss-like fields, neither has moved yet: judge neither until one does
        return values.get(chosen) if chosen is not None else values.get("loss")


def _extra(values: dict[str, float]) -> dict[str, object]:
    """The values a StepRecord has no field for; an evaluation's record is marked as one."""
    extra: dict[str, object] = logged_extra(values)
    if "eval_loss" in values and "loss" not in values:
        extra["eval"] = True
    return extra


def _file_end(path: Path) -> tuple[int, int, int] | None:
    """A file's inode, device and size now; None when there is none."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_dev, st.st_size

"""What the supervisor knows about a run's progress, and how it is shown.

:class:`RunProgress` folds step records into the figures a person wants (step,
loss, tokens/s, ETA, memory); :func:`progress_line` renders one line of them.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from steadytune.records import StepRecord


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_seconds(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


def mean_tokens_per_s(tokens: float, seconds: float) -> float | None:
    """A run's tokens/s: every token trained over every second spent on the steps that counted them.

    The one figure the end-of-run summary, ``status.json``, ``top`` and the dashboard all show; the
    last step alone (a short final batch, a step after a save) can be twice or half of it.
    """
    return tokens / seconds if tokens and seconds > 0 else None


@dataclass
class RunProgress:
    """Running figures of a run, fed with rank-0 step records (all ranks for memory)."""

    max_steps: int | None = None
    step: int = 0
    first_loss: float | None = None
    last_loss: float | None = None
    last_eval_loss: float | None = None
    tokens_total: int = 0
    step_time_total: float = 0.0
    steps_seen: int = 0
    skipped_steps: int = 0
    mem_bytes: int | None = None
    last_grad_norm: float | None = None  # rank 0's latest, non-finite included
    attempt: int = 0  # the attempt being followed; records of older ones are the abandoned timeline
    ranks: int = 0  # the most ranks that wrote step records (a job whose log only rank 0 writes: 1)
    device: str | None = None  # gpu where a record told device memory, cpu where only the process's
    _recent: list[float] = field(default_factory=list)  # recent step times, for the ETA

    def rewind(self, step: int, attempt: int) -> None:
        """Follow ``attempt`` from ``step`` (a restart from a checkpoint).

        The abandoned attempt's last lines can still arrive after this (written while
        it was being stopped, read on the next pass); counting them would put the step
        back where that attempt stood, and a run that had reached its end would show
        an ETA of 0 s while the new attempt trains from 25%. The loss and grad norm shown are the
        abandoned attempt's too (a diverged 69.26 stood for a minute after the rollback): none is
        shown until the resumed timeline logs its first step.
        """
        self.step = step
        self.attempt = max(self.attempt, attempt)
        self.last_loss = self.last_grad_norm = None

    def add(self, rec: StepRecord) -> None:
        if rec.attempt < self.attempt:
            return
        if rec.extra.get("eval"):
            self.last_eval_loss = rec.eval_loss
            return
        self.ranks = max(self.ranks, rec.rank + 1)
        if rec.mem_allocated_bytes is not None:
            self.device = "gpu"
        elif rec.rss_bytes is not None and self.device is None:
            self.device = "cpu"
        if rec.rank != 0:
            return
        if rec.attempt > self.attempt:  # a source that restarts on its own (Ray) starts the next attempt
            self.attempt = rec.attempt
            self.step = rec.step
        self.step = max(self.step, rec.step)
        if rec.grad_norm is not None:
            self.last_grad_norm = rec.grad_norm
        if rec.loss is not None and math.isfinite(rec.loss):
            if self.first_loss is None:
                self.first_loss = rec.loss
            self.last_loss = rec.loss
        if rec.skipped:
            self.skipped_steps += 1
        if rec.tokens and rec.step_time_s:
            self.tokens_total += rec.tokens
            self.step_time_total += rec.step_time_s
        if rec.step_time_s:
            self._recent.append(rec.step_time_s)
            del self._recent[:-50]
        self.steps_seen += 1
        mem = rec.mem_allocated_bytes if rec.mem_allocated_bytes is not None else rec.rss_bytes
        if mem is not None:
            self.mem_bytes = mem

    @property
    def tokens_per_s(self) -> float | None:
        return mean_tokens_per_s(self.tokens_total, self.step_time_total)

    @property
    def eta_s(self) -> float | None:
        if not self.max_steps or not self._recent:
            return None
        recent = sorted(self._recent)[len(self._recent) // 2]  # median resists one slow save step
        return max(0, self.max_steps - self.step) * recent


def progress_line(p: RunProgress, attempt: int = 0, state: str = "running") -> str:
    total = f"/{p.max_steps}" if p.max_steps else ""
    pct = f" {100 * p.step / p.max_steps:3.0f}%" if p.max_steps else ""
    loss = f"{p.last_loss:.4f}" if p.last_loss is not None else "-"
    tps = f"{p.tokens_per_s:,.0f}" if p.tokens_per_s else "-"
    parts = [
        f"step {p.step}{total}{pct}",
        f"loss {loss}",
        f"tok/s {tps}",
        f"ETA {human_seconds(p.eta_s)}",
        f"mem {human_bytes(p.mem_bytes)}",
    ]
    if p.last_eval_loss is not None:
        parts.insert(2, f"eval {p.last_eval_loss:.4f}")
    if attempt:
        parts.append(f"restarts {attempt}")
    if state != "running":
        parts.append(state)
    return " | ".join(parts)

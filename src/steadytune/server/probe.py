"""A measured probe of a ``-- CMD`` job's memory need, for a command submitted without ``--need-gib``.

A command without a config has nothing to estimate from, so the server measures it: it
starts the command alone on the roomiest GPU for a bounded time, watches the memory its
processes hold there (through the same GPU source as the ledger: NVML's per-process
figures), and stops it once that has stopped rising for ``plateau_s`` or the bound is
reached. The need is the peak plus a margin: the probe sees the first stretch of a run,
and a later evaluation or a longer batch may take a little more.

The probe runs the command for real; it is stopped (SIGTERM to its process group, then
SIGKILL), and the job later starts it again from the beginning. This module holds the
bookkeeping, pure: readings in, the verdict out. The daemon starts and stops the process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from steadytune.server.admission import gib
from steadytune.server.ledger import GpuReading

PROBE_S = 60.0  # the default bound: long enough to get past loading into the first steps
PLATEAU_S = 10.0  # the peak has not risen for this long: training has reached its steady state
MARGIN = 0.15  # on top of the peak seen


@dataclass
class Probe:
    """One probe under way."""

    job_id: str
    gpu: int
    pid: int
    started: float  # when it started (the daemon's clock)
    bound_s: float = PROBE_S
    plateau_s: float = PLATEAU_S
    peak: int = 0
    last_rise: float | None = None  # when the peak last rose
    unknown: bool = False  # NVML could not say what its processes hold
    stop_sent: float | None = None

    def observe(self, now: float, readings: tuple[GpuReading, ...], pids: set[int]) -> None:
        """One reading of the probe's GPU: the memory its processes hold there now."""
        held = 0
        for g in readings:
            if g.index != self.gpu:
                continue
            for p in g.processes:
                if p.pid in pids:
                    if p.used_bytes is None:
                        self.unknown = True
                    else:
                        held += p.used_bytes
        if held > self.peak:
            self.peak, self.last_rise = held, now

    def done(self, now: float, exited: bool) -> str | None:
        """Why the probe is over (its memory has levelled off, the bound, or the command ended), or None."""
        if exited:
            return "the command ended during the probe"
        if self.last_rise is not None and now - self.last_rise >= self.plateau_s:
            return f"its memory stopped rising for {self.plateau_s:g}s"
        if now - self.started >= self.bound_s:
            return f"the probe's bound of {self.bound_s:g}s"
        return None

    def need(self, why: str, now: float) -> tuple[int | None, str]:
        """The need per GPU (peak + margin) and its account; None and the reason when it cannot be told."""
        if self.unknown:
            return None, (
                "the probe could not see its processes' GPU memory (NVML reports it as N/A here): "
                "resubmit with --need-gib N"
            )
        if self.peak == 0:
            return None, (
                f"the probe saw no GPU memory of its processes in {now - self.started:.0f}s ({why}): "
                "resubmit with --need-gib N, or a longer --probe-s"
            )
        need = math.ceil(self.peak * (1 + MARGIN))
        return need, (
            f"measured: peak {gib(self.peak)} on GPU {self.gpu} over {now - self.started:.0f}s ({why}), "
            f"+{MARGIN:.0%} margin"
        )

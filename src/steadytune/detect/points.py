"""What detectors are shown: one record type per feed, so dispatch is one lookup.

- :class:`Signal`: one step of the primary rank's training signal (loss, gradient
  norm, eval loss, the RL objective's fields). Under data parallelism every rank
  sees the same update, so the signal is judged once. The engine names the
  objective and reads the gradient jump before any detector runs; the loss series
  then adds its verdict on the point, and the gradient series whether the norm has
  vanished, for the rules after them (the registry's order is the order they run).
- :class:`RankStep`: one step record of any rank, with the memory totals the
  engine knows (memory and pace are judged per rank; stragglers compare ranks).
- :class:`SystemPoint`: a system sample, dated at the last training step seen.
- :class:`Tick`: the time now, for rules about silence (stalls and hangs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from steadytune.objectives import LOSS_OBJECTIVE
from steadytune.records import StepRecord, SystemSample

if TYPE_CHECKING:
    from steadytune.detect.rollouts import Batch
    from steadytune.detect.stats import Tracker


@dataclass(slots=True)
class LossPoint:
    """What the loss watch learned about one point, for the trend and gradient watches.

    Not frozen: one is made for every point, and a frozen dataclass sets each field through a
    call. Nothing changes one once made.
    """

    step: int
    loss: float
    y: float
    accepted: bool
    in_spike: bool
    new_segment: bool


@dataclass(slots=True)
class Signal:
    """One primary-rank step as the training-signal detectors read it.

    ``objective`` is None until the first training record with extra fields names
    it (then :data:`~steadytune.objectives.LOSS_OBJECTIVE` for the SFT loss rules);
    ``corroborated``: the gradient norm jumped past its spike ratio at this point or
    the one before. The loss series fills ``loss`` (None: no loss judged here),
    ``held`` (it holds a spike or a divergence) and ``run_noise`` (the run's noise
    per point, read only at a segment's first point); the gradient series fills
    ``grad_vanished``. ``level_of`` is the loss series' tracker: rules read its
    level after the rules before them may have moved it (a climb held from the start). ``batch``: on an
    RL run, the rollout batch the step learned from (:mod:`.rollouts`; None on any other run).
    """

    rec: StepRecord
    objective: str | None
    corroborated: bool
    level_of: Tracker
    loss: LossPoint | None = None
    held: bool = False
    run_noise: float | None = None
    grad_vanished: bool = False
    batch: Batch | None = None

    @property
    def by_loss_rules(self) -> bool:
        """Whether the SFT loss rules judge this run (no other objective is known for it)."""
        return self.objective in (None, LOSS_OBJECTIVE)


@dataclass(frozen=True, slots=True)
class RankStep:
    """One rank's step record, with the device and host memory totals known for it (None: unknown)."""

    rec: StepRecord
    device_total: int | None = None
    ram_total: int | None = None


@dataclass(frozen=True, slots=True)
class SystemPoint:
    """A system sample; it carries no step, so findings are dated at the last training step seen."""

    sample: SystemSample
    step: int


@dataclass(frozen=True, slots=True)
class Tick:
    """The caller's clock: ``now``, the last heartbeat's time and the last step it knows of."""

    now: float
    heartbeat_ts: float | None
    last_step: int | None

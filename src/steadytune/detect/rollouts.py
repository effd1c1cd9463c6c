"""Which rollout batch an RL step learned from, when the trainer reuses one for several steps.

A GRPO trainer with ``num_iterations`` > 1 (or ``steps_per_generation`` > 1) takes
several optimizer steps on one batch of rollouts. What it logs about the batch's
rewards (the reward under any of the names the objective rules read, ``reward_std``,
``frac_reward_zero_std``, the reward's or the advantages' range) belongs to the batch,
not to the step, and reaches the log one of two ways:

- **missing** on the steps after the first: TRL computes the reward fields when it
  generates and clears them once logged, so the further steps log the loss, the
  norm and the KL alone. Those steps still learn from the same rollouts: whether
  the batch's groups tied is carried over to them (the gradient rule needs it: the
  norm of a further step on a tied batch is the KL term's as much as the first
  one's), but they bring no new batch to count;
- **repeated** on every step (a logger that writes the last value it has, an export
  that fills gaps forward): the same values ``k`` times in a row. Counted as they
  come, each batch would weigh ``k`` points, and a window of 16 logged points would
  hold 16/k batches: a healthy run of one group of four, which ties three batches
  in four, would tie a whole window of four batches one time in three. So ``k`` is
  learned where it shows: a batch with spread (some reward standard deviation, or a
  tied share strictly between 0 and 1) repeated exactly is no chance coincidence
  when the last ``_CONFIRM`` (3) such batches all came exactly ``k`` times. Then
  one point in every ``k`` of a run of identical values is a new batch: a dead
  run's identical all-tied batches still count, ``k`` times slower, as they should.
  A log whose batches with spread come once each (a chance repeat does not come
  three times alike) keeps ``k`` = 1, and every point counts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from steadytune.objectives import REWARD_KEYS, TIE_KEYS, first, tied_share

ROLLOUT_KEYS = ("reward", "reward_std", "frac_reward_zero_std")
_CONFIRM = 3  # batches with spread seen exactly k times running before k is believed


@dataclass(frozen=True, slots=True)
class Batch:
    """What an RL step learned from: its batch's tied share (None: unknown), and whether the batch
    was counted at an earlier step already (``again``)."""

    tied: float | None
    again: bool
    # The batch's fields, spread included, exactly as at the step before: a repeat, whether or not the
    # log's repeat count is known yet (the reward's fall is no fall for being written twice).
    echo: bool = False


class RolloutBatches:
    """The rollout batch behind each RL step of one run, from what the step logged."""

    def __init__(self) -> None:
        self._last: tuple[Any, ...] | None = None  # the last logged batch's fields
        self._tied: float | None = None
        self._spread = False  # whether the last batch had spread (a repeat of it tells k)
        self._run = 0  # how many times the last fields came again, in a row
        self._runs: deque[int] = deque(maxlen=_CONFIRM)  # how often each recent batch with spread came
        self._k = 1

    def see(self, extra: Mapping[str, Any] | None) -> Batch:
        """The step's batch, from the record's fields (``extra``)."""
        fields = _batch_fields(extra)
        if not any(v is not None for v in fields):
            # No reward field: a further step on the last batch, if there was one.
            return Batch(self._tied, self._last is not None)
        tied = tied_share(extra)
        if fields == self._last:
            self._run += 1
            return Batch(tied, self._run % self._k != 0, self._spread)
        if self._spread and self._last is not None:
            self._runs.append(self._run + 1)
            if len(self._runs) == _CONFIRM and len(set(self._runs)) == 1:
                self._k = self._runs[0]
        self._last, self._tied, self._run = fields, tied, 0
        std = extra.get("reward_std") if extra else None
        self._spread = (isinstance(std, int | float) and std > 0) or (tied is not None and 0.0 < tied < 1.0)
        return Batch(tied, False)


def _batch_fields(extra: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """What the step logged of its batch: the reward (by whichever name the log gives it, verl's
    ``critic/score/mean`` as much as TRL's ``reward``) and every field that tells its spread."""
    if not extra:
        return ()
    found = first(extra, REWARD_KEYS)
    return (found[1] if found is not None else None, *(extra.get(k) for k in TIE_KEYS))

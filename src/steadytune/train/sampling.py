"""A training sampler that honours a skip list of sample ids, and keeps its place across restarts.

The permutation of an epoch depends only on (seed, epoch), never on RNG state, so a resumed
worker sees the same order as the run it replaces; skipped ids are simply dropped from it.

A skip list shortens every epoch it applies to, so the HF Trainer's own placement of a resumed
run (``global_step // len(dataloader)`` epochs, the rest in batches) is wrong as soon as the
epochs before the checkpoint had another length. The run's place is therefore kept as a
:class:`DataPosition` (an epoch and an offset into its *full* permutation, which no skip list
changes), saved in each checkpoint; on resume the sampler starts there, and :func:`place` tells
the Trainer which of its epochs that is and how many leading batches to pass over, so that its
step counting and gradient accumulation line up with the rest of the epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Sampler


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class DataPosition:
    """``offset`` entries of epoch ``epoch``'s full permutation lie behind the run (trained or skipped)."""

    epoch: int = 0
    offset: int = 0


@dataclass(frozen=True)
class Batching:
    """How the Trainer cuts an epoch's order: ``micro`` samples a batch, ``accum`` batches a step on each
    of ``world`` processes (accelerate deals the batches out in turn and pads the last round, so every
    process gets as many)."""

    micro: int
    accum: int = 1
    world: int = 1

    def rank_batches(self, samples: int) -> int:
        """Batches each process gets from ``samples`` samples in order (the last ones may be short)."""
        return _ceil(_ceil(samples, self.micro), self.world)

    def steps(self, samples: int) -> int:
        """Optimizer steps ``samples`` samples make (the last may accumulate fewer batches)."""
        return _ceil(self.rank_batches(samples), self.accum)

    @property
    def per_step(self) -> int:
        return self.micro * self.accum * self.world


def advance(
    position: DataPosition, steps: int, kept: Callable[[int], Sequence[bool]], batching: Batching
) -> DataPosition:
    """The position ``steps`` optimizer steps after ``position``.

    ``kept(epoch)`` says, along that epoch's full permutation, which entries are trained (not skipped).
    An epoch's last step may be short; the next step starts the next epoch.
    """
    if steps < 0:
        raise ValueError(f"steps={steps}: a position only moves forward")
    epoch, offset = position.epoch, position.offset
    while True:
        flags = kept(epoch)
        tail = [j for j in range(offset, len(flags)) if flags[j]]
        left = batching.steps(len(tail))
        if steps < left:
            return DataPosition(epoch, tail[steps * batching.per_step - 1] + 1 if steps else offset)
        if offset == 0 and not tail:
            raise ValueError(f"epoch {epoch} has no sample left to train: the skip list names them all")
        steps -= left
        epoch, offset = epoch + 1, 0


@dataclass(frozen=True)
class Placement:
    """Where the Trainer's loop resumes: its epoch ``epoch`` runs the position's epoch, after passing over
    ``lead_batches`` batches (on each process) that the sampler puts before the rest of that epoch."""

    epoch: int
    lead_batches: int


def place(
    position: DataPosition,
    global_step: int,
    tail_samples: int,
    epoch_samples: int,
    steps_per_epoch: int,
    batching: Batching,
) -> Placement:
    """The Trainer's placement of a resume at ``global_step``, ``tail_samples`` samples left in the epoch
    of ``position`` and ``epoch_samples`` (``steps_per_epoch`` steps) in a whole epoch now.

    The lead makes the Trainer's count of the epoch's batches reach its end exactly where the epoch's
    last batch is, so the last, possibly short, step is taken there (and not carried into the next
    epoch). Its epoch is the position's, except where earlier epochs were shorter than one is now:
    then an earlier one, so that the epochs it counts still hold the steps up to ``max_steps``.
    """
    if tail_samples > epoch_samples:
        raise ValueError(f"{tail_samples} samples left of an epoch of {epoch_samples}: not one epoch's tail")
    lead = batching.rank_batches(epoch_samples) - batching.rank_batches(tail_samples)
    behind = max(0, (global_step - lead // batching.accum) // max(1, steps_per_epoch))
    return Placement(min(position.epoch, behind), lead)


class SkipSampler(Sampler[int]):
    def __init__(
        self, sample_ids: Sequence[int], seed: int, skip: set[int] | None = None, shuffle: bool = True
    ) -> None:
        self.sample_ids = list(sample_ids)
        self.seed = seed
        self.skip = skip or set()
        self.shuffle = shuffle
        self.epoch = 0  # the Trainer's epoch; data_epoch() is the permutation it runs
        self.start = DataPosition()
        self._start_frame = 0
        self._lead = 0
        self._perms: dict[int, list[int]] = {}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def start_at(self, position: DataPosition, placement: Placement, batching: Batching) -> None:
        """Run from ``position``: the Trainer's epoch ``placement.epoch`` is the position's epoch, led by
        the batches it passes over."""
        self.start = position
        self.epoch = self._start_frame = placement.epoch
        self._lead = placement.lead_batches * batching.micro * batching.world

    def data_epoch(self) -> int:
        return self.start.epoch + self.epoch - self._start_frame

    def permutation(self, epoch: int) -> list[int]:
        """Dataset positions of ``epoch`` in order, none skipped."""
        if epoch not in self._perms:
            n = len(self.sample_ids)
            if self.shuffle:
                g = torch.Generator()
                g.manual_seed(self.seed + epoch)
                perm = torch.randperm(n, generator=g).tolist()
            else:
                perm = list(range(n))
            self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}  # the last two suffice
            self._perms[epoch] = perm
        return self._perms[epoch]

    def kept(self, epoch: int) -> list[bool]:
        """Along ``epoch``'s permutation, whether each entry is trained."""
        return [self.sample_ids[i] not in self.skip for i in self.permutation(epoch)]

    def order(self) -> list[int]:
        """Dataset positions in the order the current epoch trains them, skipped ones removed."""
        return [i for i in self.permutation(self.data_epoch()) if self.sample_ids[i] not in self.skip]

    def tail(self) -> list[int]:
        """What is left of the start position's epoch, skipped ones removed."""
        perm = self.permutation(self.start.epoch)
        return [i for i in perm[self.start.offset :] if self.sample_ids[i] not in self.skip]

    def __iter__(self) -> Iterator[int]:
        order = self.order()
        if self.data_epoch() != self.start.epoch or not (self.start.offset or self._lead):
            return iter(order)
        # The lead is only counted off by the Trainer, never loaded; the epoch's own beginning makes it
        # what a run that never stopped would have passed there.
        lead = [order[j % len(order)] for j in range(self._lead)] if order else []
        return iter(lead + self.tail())

    def __len__(self) -> int:
        return sum(1 for i in self.sample_ids if i not in self.skip)

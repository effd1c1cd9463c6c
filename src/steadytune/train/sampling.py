"""A training sampler that honours a skip list of sample ids, and keeps its order across restarts.

The permutation depends only on (seed, epoch), never on RNG state, so a resumed
worker sees the same order as the run it replaces; skipped ids are simply
dropped from it. Since a rollback only skips samples *after* the checkpoint it
resumes from, the batches before that point are unchanged, and the HF Trainer's
"skip the batches already trained" on resume stays exact.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler


class SkipSampler(Sampler[int]):
    def __init__(
        self, sample_ids: Sequence[int], seed: int, skip: set[int] | None = None, shuffle: bool = True
    ) -> None:
        self.sample_ids = list(sample_ids)
        self.seed = seed
        self.skip = skip or set()
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self) -> list[int]:
        """Dataset positions in the order they are trained, skipped ones removed."""
        n = len(self.sample_ids)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            perm = torch.randperm(n, generator=g).tolist()
        else:
            perm = list(range(n))
        return [i for i in perm if self.sample_ids[i] not in self.skip]

    def __iter__(self) -> Iterator[int]:
        return iter(self.order())

    def __len__(self) -> int:
        return sum(1 for i in self.sample_ids if i not in self.skip)

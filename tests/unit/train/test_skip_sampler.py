"""SkipSampler: the order depends only on (seed, epoch); skipped sample ids are dropped and nothing else
moves."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # the sampler lives in the worker, with the training extras

from steadytune.train.sampling import SkipSampler  # noqa: E402

IDS = list(range(100, 164))  # sample ids need not be dataset positions


def test_the_order_is_a_permutation_fixed_by_seed_and_epoch() -> None:
    a, b = SkipSampler(IDS, seed=7), SkipSampler(IDS, seed=7)
    torch.manual_seed(0)
    first = list(a)
    torch.manual_seed(12345)  # the global RNG (which a restart does not restore) plays no part
    assert list(b) == first and sorted(first) == list(range(len(IDS))) and first != sorted(first)
    assert list(SkipSampler(IDS, seed=8)) != first
    a.set_epoch(1)
    second = list(a)
    assert second != first and sorted(second) == sorted(first)
    a.set_epoch(0)
    assert list(a) == first  # the same epoch again (a resumed worker) is the same order


def test_skipping_drops_exactly_those_ids_and_keeps_the_rest_in_order() -> None:
    full = SkipSampler(IDS, seed=3).order()
    skip = {IDS[p] for p in full[20:28]} | {999}  # eight samples in the middle, and an id that is not there
    kept = SkipSampler(IDS, seed=3, skip=skip).order()
    assert kept == [p for p in full if IDS[p] not in skip]
    assert kept[:20] == full[:20]  # what came before the skipped samples is untouched (resume stays exact)
    assert len(SkipSampler(IDS, seed=3, skip=skip)) == len(kept) == len(IDS) - 8
    for epoch in (1, 2):  # and in every later epoch, wherever the shuffle puts them
        s, ref = SkipSampler(IDS, seed=3, skip=skip), SkipSampler(IDS, seed=3)
        s.set_epoch(epoch)
        ref.set_epoch(epoch)
        assert s.order() == [p for p in ref.order() if IDS[p] not in skip]


def test_unshuffled_order_is_the_dataset_order_minus_the_skipped() -> None:
    s = SkipSampler(IDS, seed=0, skip={100, 163}, shuffle=False)
    assert list(s) == list(range(1, 63)) and len(s) == 62


def test_through_a_dataloader_the_batches_before_the_skip_are_unchanged() -> None:
    from torch.utils.data import DataLoader

    data = [{"id": i} for i in IDS]

    def batches(skip: set[int]) -> list[list[int]]:
        loader = DataLoader(data, batch_size=4, sampler=SkipSampler(IDS, seed=5, skip=skip),
                            collate_fn=lambda rows: [r["id"] for r in rows])  # fmt: skip
        return list(loader)

    full = batches(set())
    skip = set(full[5]) | set(full[6])  # the samples of the 6th and 7th steps, as a rollback would skip them
    cut = batches(skip)
    assert cut[:5] == full[:5] and len(cut) == len(full) - 2
    assert [i for b in cut for i in b] == [i for b in full for i in b if i not in skip]

"""Placing a resumed run in its sample order (``train/sampling.py``): the arithmetic, on generated cases.

The reference is a run that never stopped, cut into batches and dealt out to the processes by
accelerate's own batch samplers, and stepped the way the HF Trainer's epoch loop steps (a batch
count per epoch, an optimizer step every ``accum`` batches and at the epoch's last batch).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")  # the sampler lives in the worker, with the training extras
data_loader = pytest.importorskip("accelerate.data_loader")

from torch.utils.data import BatchSampler  # noqa: E402

from steadytune.train.sampling import (  # noqa: E402
    Batching,
    DataPosition,
    Placement,
    SkipSampler,
    advance,
    place,
)

CASES = settings(max_examples=150, deadline=None)

Step = tuple[tuple[int, ...], ...]  # each process's samples of one optimizer step


def rank_iterators(sampler: SkipSampler, b: Batching, lead: int) -> list[Iterator[list[int]]]:
    """Each process's batches of the current epoch as accelerate deals them, ``lead`` passed over."""
    out = []
    for rank in range(b.world):
        shard: object = data_loader.BatchSamplerShard(
            BatchSampler(sampler, b.micro, drop_last=False), b.world, rank, even_batches=True
        )
        if lead:
            shard = data_loader.SkipBatchSampler(shard, lead)
        out.append(iter(shard))  # type: ignore[call-overload]
    return out


def trainer_steps(sampler: SkipSampler, b: Batching, placement: Placement, count: int) -> list[Step]:
    """``count`` optimizer steps as the HF Trainer's epoch loop takes them, from ``placement``."""
    per_epoch = b.rank_batches(len(sampler))
    steps_per_epoch = b.steps(len(sampler))
    steps: list[Step] = []
    epoch = placement.epoch
    while len(steps) < count:
        sampler.set_epoch(epoch)
        lead = placement.lead_batches if epoch == placement.epoch else 0
        ranks = rank_iterators(sampler, b, lead)
        batch = lead - 1
        pending: list[list[int]] = [[] for _ in ranks]
        last = per_epoch % b.accum or b.accum
        for update in range(lead // b.accum, steps_per_epoch):
            for _ in range(b.accum if update != steps_per_epoch - 1 else last):
                got = [next(it, None) for it in ranks]
                if got[0] is None:
                    break
                batch += 1
                for r, samples in enumerate(got):
                    pending[r] += samples or []
                if (batch + 1) % b.accum == 0 or batch + 1 == per_epoch:
                    steps.append(tuple(tuple(p) for p in pending))
                    pending = [[] for _ in ranks]
        assert not any(pending), "a batch was left unstepped at the end of the epoch"
        epoch += 1
    return steps[:count]


def position_after(sampler: SkipSampler, b: Batching, steps: list[Step], epoch_steps: int) -> DataPosition:
    """Where a never-stopped run stands after ``steps``: whole epochs of ``epoch_steps``, then a part."""
    epoch, into = divmod(len(steps), epoch_steps)
    if into == 0:
        return DataPosition(epoch, 0)
    where = {pos: j for j, pos in enumerate(sampler.permutation(epoch))}
    trained = [i for step in steps[len(steps) - into :] for rank in step for i in rank]
    return DataPosition(epoch, 1 + max(where[i] for i in trained))


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[int], int, set[int], Batching]:
    n = draw(st.integers(1, 30))
    ids = [100 + i for i in range(n)]  # ids are not positions
    skip = set(draw(st.lists(st.sampled_from(ids), max_size=n - 1, unique=True)))
    b = Batching(draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    return ids, draw(st.integers(0, 10_000)), skip, b


@CASES
@given(runs(), st.integers(0, 40))
def test_advance_finds_where_an_unstopped_run_stands(run: tuple, at: int) -> None:
    ids, seed, skip, b = run
    sampler = SkipSampler(ids, seed, skip)
    epoch_steps = b.steps(len(sampler))
    reference = trainer_steps(sampler, b, Placement(0, 0), at)
    assert advance(DataPosition(), at, sampler.kept, b) == position_after(sampler, b, reference, epoch_steps)


@CASES
@given(runs(), st.integers(0, 40), st.integers(0, 40))
def test_advancing_in_two_goes_is_advancing_once(run: tuple, first: int, then: int) -> None:
    ids, seed, skip, b = run
    kept = SkipSampler(ids, seed, skip).kept
    middle = advance(DataPosition(), first, kept, b)
    assert advance(middle, then, kept, b) == advance(DataPosition(), first + then, kept, b)


@CASES
@given(runs(), st.integers(0, 40), st.data())
def test_a_resume_after_a_rollback_trains_what_an_unstopped_run_with_its_skip_list_would(
    run: tuple, at: int, data: st.DataObject
) -> None:
    """A run trains ``at`` steps with one skip list; a rollback there adds samples of its epoch's rest.
    The resumed run's steps are the steps of a run that had the whole skip list from the checkpoint on:
    the same samples, in the same batches, on the same processes, in the same optimizer steps."""
    ids, seed, skip, b = run
    before = SkipSampler(ids, seed, skip)
    position = advance(DataPosition(), at, before.kept, b)
    rest = [ids[i] for i in before.permutation(position.epoch)[position.offset :] if ids[i] not in skip]
    window = set(data.draw(st.lists(st.sampled_from(rest), unique=True), "window")) if rest else set()
    if len(skip | window) == len(ids):
        window.discard(rest[-1])  # something must remain to train
    skip_now = skip | window

    resumed = SkipSampler(ids, seed, skip_now)
    epoch_steps = b.steps(len(resumed))
    tail = sum(resumed.kept(position.epoch)[position.offset :])
    placement = place(position, at, tail, len(resumed), epoch_steps, b)
    resumed.start_at(position, placement, b)
    count = 2 * epoch_steps + 1
    got = trainer_steps(resumed, b, placement, count)

    # The unstopped run with the whole skip list: the checkpoint's prefix of its epoch is the same
    # (the window lies after it), so its steps go on from the same step of that epoch.
    done_in_epoch = at - position.epoch * b.steps(len(before)) if position.offset else 0
    unstopped = trainer_steps(
        SkipSampler(ids, seed, skip_now), b, Placement(0, 0), (position.epoch + 4) * epoch_steps
    )
    start = position.epoch * epoch_steps + done_in_epoch
    assert got == unstopped[start : start + count]
    assert not window & {ids[i] for step in got for rank in step for i in rank}
    # The Trainer counts no more steps behind the resume than it made, so max_steps is still reached.
    assert placement.epoch * epoch_steps + placement.lead_batches // b.accum <= at


def test_a_checkpoint_of_a_shortened_epoch_is_placed_in_it_not_in_a_later_one() -> None:
    """The bug this arithmetic replaces: 48 samples, 4 a step, a rollback at step 16 (4 steps into the
    second epoch) skipping 8 samples. The HF count (16 // 10 steps an epoch now) puts the resume 6 steps
    into the second epoch; the run is 4 steps into it, 6 steps left."""
    ids = list(range(48))
    b = Batching(4)
    first = SkipSampler(ids, seed=1)
    position = advance(DataPosition(), 16, first.kept, b)
    assert position == DataPosition(1, 16)
    window = {ids[i] for i in first.permutation(1)[16:24]}
    resumed = SkipSampler(ids, seed=1, skip=window)
    tail = sum(resumed.kept(1)[16:])
    assert tail == 24
    placement = place(position, 16, tail, len(resumed), b.steps(len(resumed)), b)
    assert placement == Placement(1, 4)  # the Trainer passes over 4 of the epoch's 10 batches, 6 to train
    resumed.start_at(position, placement, b)
    assert list(resumed)[16:] == [i for i in first.permutation(1)[16:] if ids[i] not in window]


def test_a_skip_list_naming_every_sample_is_an_error() -> None:
    s = SkipSampler([1, 2], seed=0, skip={1, 2})
    with pytest.raises(ValueError, match="no sample left"):
        advance(DataPosition(), 1, s.kept, Batching(1))

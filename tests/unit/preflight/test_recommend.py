"""The recommendation keeps the effective batch and asks for checkpointing only when needed."""

from __future__ import annotations

import dataclasses

import pytest

from steadytune.estimate import TrainSetup, estimate_peak, load_architecture
from steadytune.estimate.batch import (
    AUTO_MICRO_BATCH_LIMIT,
    auto_effective_batch,
    divisors,
    largest_divisor_at_most,
)
from steadytune.preflight.recommend import recommend

from .conftest import GiB

LLAMA8B = load_architecture(
    __import__("pathlib").Path(__file__).resolve().parents[3] / "examples/models/llama-3.1-8b"
)
LORA = TrainSetup(
    method="lora",
    dtype="bf16",
    target_modules=("all-linear",),
    lora_r=16,
    batch=2,
    seq=2048,
    gradient_accumulation_steps=8,
)


def test_divisors() -> None:
    assert divisors(1) == [1]
    assert divisors(32) == [1, 2, 4, 8, 16, 32]
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert largest_divisor_at_most(12, 5) == 4 and largest_divisor_at_most(7, 6) == 1


def peak(batch: int, seq: int = 2048, ckpt: bool = False) -> int:
    """The estimated peak of one shape of LORA at effective batch 16."""
    shape = dataclasses.replace(LORA, batch=batch, seq=seq, gradient_accumulation_steps=16 // batch,
                                gradient_checkpointing=ckpt)  # fmt: skip
    return estimate_peak(LLAMA8B, shape).peak_bytes


# memory (GiB) -> (micro-batch, accumulation, checkpointing); None: not even one token fits.
EXPECTED = {16: None, 24: (1, 16, True), 40: (1, 16, False), 80: (2, 8, False), 141: (4, 4, False)}


@pytest.mark.parametrize("memory", sorted(EXPECTED))
def test_effective_batch_is_kept_and_the_shape_fits(memory: int) -> None:
    budget = memory * GiB
    rec = recommend(LLAMA8B, LORA, budget, 16)
    expected = EXPECTED[memory]
    if expected is None:
        assert peak(1, seq=1, ckpt=True) > budget  # the smallest shape there is does not fit
        assert (rec.per_device_train_batch_size, rec.max_seq_length) == (None, None)
        assert "not even one token fits" in rec.notes[-1]
        return
    batch, accum, ckpt = expected
    assert (
        rec.per_device_train_batch_size,
        rec.gradient_accumulation_steps,
        rec.gradient_checkpointing,
    ) == expected
    assert rec.max_seq_length == 2048 and batch * accum == 16
    assert rec.peak_bytes == peak(batch, ckpt=ckpt) <= budget
    # The largest that fits: the next divisor of 16 does not, and checkpointing only when nothing fits
    # without.
    bigger = [d for d in (1, 2, 4, 8, 16) if d > batch]
    assert not bigger or peak(bigger[0], ckpt=ckpt) > budget
    assert not ckpt or peak(1) > budget


def test_checkpointing_only_when_nothing_fits_without_it() -> None:
    roomy = recommend(LLAMA8B, LORA, 79 * GiB, 16)
    assert roomy.gradient_checkpointing is False and roomy.per_device_train_batch_size == 2
    assert any("would fit with it" in n for n in roomy.notes)
    tight = recommend(LLAMA8B, LORA, 23 * GiB, 16)
    assert tight.gradient_checkpointing is True and tight.per_device_train_batch_size == 1
    assert tight.gradient_accumulation_steps == 16


def test_too_small_lowers_the_sequence_length_and_nothing_fits_says_so() -> None:
    budget = 17 * GiB
    assert peak(1, ckpt=True) > budget  # micro-batch 1 at the configured 2048 does not fit
    small = recommend(LLAMA8B, LORA, budget, 16)
    assert (small.per_device_train_batch_size, small.gradient_accumulation_steps) == (1, 16)
    assert small.gradient_checkpointing is True
    # The longest sequence that fits, not just any shorter one: one token more would not.
    seq = small.max_seq_length
    assert peak(1, seq, ckpt=True) <= budget < peak(1, seq + 1, ckpt=True)
    assert small.peak_bytes == peak(1, seq, ckpt=True)
    none = recommend(LLAMA8B, LORA, 4 * GiB, 16)
    assert none.per_device_train_batch_size is None and "not even one token" in none.notes[-1]


def test_sequence_capped_at_max_position_embeddings(demo_arch) -> None:
    rec = recommend(demo_arch, TrainSetup(method="full", seq=512, device="cpu"), 8 * GiB, 8)
    assert rec.max_seq_length == 256 and "max_position_embeddings" in rec.notes[0]


def test_unknown_budget_gives_no_micro_batch() -> None:
    rec = recommend(LLAMA8B, LORA, None, 16)
    assert rec.per_device_train_batch_size is None and rec.effective_batch == 16


def test_auto_effective_batch(demo_arch) -> None:
    setup = TrainSetup(method="full", seq=64, device="cpu")
    assert auto_effective_batch(demo_arch, setup, GiB, 48, 2) == 48  # configured wins
    assert auto_effective_batch(demo_arch, setup, 64 * GiB, None, 2) == AUTO_MICRO_BATCH_LIMIT * 2  # capped
    assert auto_effective_batch(demo_arch, setup, 1, None, 3) == 3  # nothing fits: 1 x accumulation

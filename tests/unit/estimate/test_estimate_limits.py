"""Largest micro-batch and sequence length: the answer fits, the next one does not."""

from __future__ import annotations

import dataclasses

import pytest

from steadytune.estimate import (
    Architecture,
    TrainSetup,
    estimate_peak,
    max_micro_batch,
    max_seq_len,
    suggestions,
)

GiB = 1024**3


@pytest.mark.parametrize(
    ("setup", "memory"),
    [
        (TrainSetup(method="lora", seq=2048), 40 * GiB),
        (TrainSetup(method="qlora", seq=4096, gradient_checkpointing=True), 16 * GiB),
        (TrainSetup(method="full", seq=1024, zero_stage=3, gpus=8), 80 * GiB),
        (TrainSetup(method="lora", seq=512, attn="eager"), 40 * GiB),
    ],
)
def test_max_micro_batch_is_the_largest_that_fits(
    llama8b: Architecture, setup: TrainSetup, memory: int
) -> None:
    best = max_micro_batch(llama8b, setup, memory)
    assert best is not None and best >= 1
    assert estimate_peak(llama8b, dataclasses.replace(setup, batch=best)).peak_bytes <= memory
    assert estimate_peak(llama8b, dataclasses.replace(setup, batch=best + 1)).peak_bytes > memory


def test_max_micro_batch_is_none_when_one_does_not_fit(llama8b: Architecture) -> None:
    assert max_micro_batch(llama8b, TrainSetup(method="full", seq=2048), 80 * GiB) is None


def test_max_seq_len_is_the_longest_that_fits(llama8b: Architecture) -> None:
    setup = TrainSetup(method="qlora", batch=1, gradient_checkpointing=True)
    best = max_seq_len(llama8b, setup, 24 * GiB)
    assert best is not None
    assert estimate_peak(llama8b, dataclasses.replace(setup, seq=best)).peak_bytes <= 24 * GiB
    assert estimate_peak(llama8b, dataclasses.replace(setup, seq=best + 1)).peak_bytes > 24 * GiB


def test_max_seq_len_stops_at_the_cap(tiny: Architecture) -> None:
    assert max_seq_len(tiny, TrainSetup(method="lora"), 1024 * GiB, cap=4096) == 4096


def test_suggestions_fix_a_run_that_does_not_fit(llama8b: Architecture) -> None:
    setup = TrainSetup(method="lora", batch=4, seq=2048)
    memory = 24 * GiB
    assert estimate_peak(llama8b, setup).peak_bytes > memory
    found = suggestions(llama8b, setup, memory)
    assert found and found[0].fits
    assert any("gradient checkpointing" in s.change for s in found)
    for s in found:
        assert s.peak_bytes == estimate_peak(llama8b, s.setup).peak_bytes
    # One change at a time: from LoRA, QLoRA keeps the adapter (it once also became r=16 on all linears).
    (q,) = [s for s in found if s.setup.method == "qlora"]
    assert q.setup == dataclasses.replace(setup, method="qlora") and "the same adapter" in q.change
    kept = [s for s in found if "micro-batch" in s.change]
    for s in kept:
        # The effective batch is kept.
        assert s.setup.batch * s.setup.gradient_accumulation_steps >= setup.batch

"""The auto micro-batch search, with a fake measurement: exact probe sequences, effective batch kept."""

from __future__ import annotations

import pytest

from steadytune.estimate import TrainSetup, estimate_peak
from steadytune.train.autobatch import AutoBatchError, choose, gallop_search, memory_cap

from .conftest import DEMO, MiB

CANDIDATES = [1, 2, 4, 8, 16, 32, 64]


def search(limit: int, start: int):
    return gallop_search(CANDIDATES, start, lambda b: b <= limit)


def test_an_accurate_estimate_costs_two_probes() -> None:
    assert search(8, 8) == (8, [(8, True), (16, False)])


def test_an_optimistic_estimate_gallops_down() -> None:
    assert search(2, 32) == (2, [(32, False), (16, False), (4, False), (1, True), (2, True)])


def test_a_pessimistic_estimate_gallops_up_then_bisects() -> None:
    assert search(32, 2) == (32, [(2, True), (4, True), (16, True), (64, False), (32, True)])


def test_nothing_fits_and_everything_fits() -> None:
    assert search(0, 4) == (None, [(4, False), (2, False), (1, False)])
    assert search(1000, 64) == (64, [(64, True)])


def test_probe_budget_returns_the_best_confirmed() -> None:
    best, probed = gallop_search(CANDIDATES, 1, lambda b: b <= 32, max_probes=2)
    assert best == 2 and len(probed) == 2


SETUP = TrainSetup(method="full", dtype="fp32", mixed_precision=False, seq=64, device="cpu")


def fake_measure(per_sample: int, base: int, oom_above: int | None = None):
    calls: list[int] = []

    def measure(b: int) -> int | None:
        calls.append(b)
        return None if oom_above is not None and b > oom_above else base + per_sample * b

    return measure, calls


def demo_params() -> int:
    """The demo model's parameters, counted from its shapes (untied head, no biases)."""
    h, v, i = DEMO.hidden_size, DEMO.vocab_size, DEMO.intermediate_size
    q, kv = DEMO.num_heads * DEMO.head_dim, DEMO.num_kv_heads * DEMO.head_dim
    layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h  # attention, MLP, two norms
    return v * h + DEMO.num_layers * layer + h + v * h  # embeddings, layers, final norm, lm_head


def test_choose_keeps_the_effective_batch_and_reports_its_probes() -> None:
    measure, calls = fake_measure(per_sample=MiB, base=6 * MiB)
    found = choose(DEMO, SETUP, cap=20 * MiB, target_effective=32, measure=measure)
    assert (found.per_device_train_batch_size, found.gradient_accumulation_steps) == (8, 4)
    # The estimate picks the start: the largest divisor of 32 at most the estimated batch.
    assert 8 <= found.estimated_batch < 16
    # The measured step zeroes its gradients; accumulating keeps them alive (fp32, one per parameter),
    # so that much is added to each measurement: 8 fits (15.6 MiB), 16 does not (23.6 MiB), and 8 and
    # 16 are neighbours among the divisors of 32, so the search ends after those two probes.
    grads = 4 * demo_params()
    assert calls == [8, 16]
    assert [(p.batch, p.peak_bytes, p.fits) for p in found.probes] == [
        (8, 6 * MiB + 8 * MiB + grads, True),
        (16, 6 * MiB + 16 * MiB + grads, False),
    ]


def test_choose_treats_oom_as_too_big() -> None:
    measure, _ = fake_measure(per_sample=1, base=1, oom_above=4)
    found = choose(DEMO, SETUP, cap=1 << 40, target_effective=16, measure=measure)
    assert found.per_device_train_batch_size == 4 and found.gradient_accumulation_steps == 4
    assert any(p.peak_bytes is None and not p.fits for p in found.probes)


def test_choose_without_measurement_trusts_the_estimate() -> None:
    cap = estimate_peak(
        DEMO, TrainSetup(**{**SETUP.__dict__, "batch": 4, "gradient_accumulation_steps": 4})
    ).peak_bytes
    found = choose(DEMO, SETUP, cap=cap, target_effective=16, measure=None)
    assert (found.per_device_train_batch_size, found.gradient_accumulation_steps) == (
        4,
        4,
    ) and found.probes == ()


def test_choose_fails_with_the_fix_when_nothing_fits() -> None:
    measure, _ = fake_measure(per_sample=MiB, base=64 * MiB)
    with pytest.raises(AutoBatchError, match="gradient_checkpointing"):
        choose(DEMO, SETUP, cap=8 * MiB, target_effective=8, measure=measure)


def test_memory_cap_env_wins_over_the_config() -> None:
    assert memory_cap(123, {}) == 123
    assert memory_cap(123, {"STEADYTUNE_MEMORY_CAP": "2MiB"}) == 2 * MiB
    assert memory_cap(None, {}) is None

"""The per-process memory cap's arithmetic (CUDA itself is proven by benchmarks/gpu_check.py)."""

from __future__ import annotations

import pytest

from steadytune.guard.memcap import apply_memory_cap, cap_fraction
from steadytune.jobenv import MEMORY_CAP_ENV, parse_cap

GIB = 1 << 30


def test_the_fraction_is_the_cap_over_the_device():
    assert cap_fraction(20 * GIB, 80 * GIB) == 0.25
    assert cap_fraction(1, 3) == pytest.approx(1 / 3)
    assert cap_fraction(80 * GIB, 80 * GIB) is None  # the whole device caps nothing
    assert cap_fraction(100 * GIB, 80 * GIB) is None


def test_bad_values_are_named():
    with pytest.raises(ValueError, match=rf"{MEMORY_CAP_ENV}='20G'.*whole number of bytes"):
        parse_cap("20G")
    with pytest.raises(ValueError, match="> 0"):
        parse_cap("0")
    with pytest.raises(ValueError, match="reports 0 bytes"):
        cap_fraction(GIB, 0)
    assert parse_cap(None) is None and parse_cap(" ") is None and parse_cap("1024") == 1024


def test_without_the_variable_nothing_is_imported_or_set():
    assert apply_memory_cap({}) is None

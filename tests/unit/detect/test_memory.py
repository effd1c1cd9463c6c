"""Memory leak versus allocator caching and warm-up; headroom."""

from __future__ import annotations

import random

from steadytune.detect import DetectConfig
from tests.unit.detect.helpers import feed, kinds, noisy, raised, records

GIB = 1 << 30


def _mem(n: int, leak_from: int | None = None, rate: float = 0.0, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        base = 20 * GIB * (0.6 + 0.4 * min(1.0, (i + 1) / 5))  # optimizer state appears during warm-up
        base *= 1 + rng.gauss(0, 0.002)
        if leak_from is not None and i >= leak_from:
            base += rate * (i - leak_from)
        out.append(int(base))
    return out


def _cfg() -> DetectConfig:
    return DetectConfig.model_validate({"memory": {"device_total_bytes": 80 * GIB}})


def test_steady_growth_is_a_leak_with_projected_oom() -> None:
    rate = 60 * GIB / 1000  # OOM 1000 steps after the leak starts
    mem = _mem(600, leak_from=200, rate=rate)
    got = raised(feed(records(noisy(600, decay=0.01), mem_allocated_bytes=mem), _cfg()))
    leak = next(a for a in got if a.kind == "memory_leak")
    assert 200 < leak.start_step < 300
    ev = leak.evidence
    assert ev["headroom_free_ratio"] > 0.5
    assert 500 < ev["projected_steps_to_oom"] < 1200
    assert "tensors kept across steps" in leak.cause


def test_warmup_and_a_one_off_step_are_not_leaks() -> None:
    mem = _mem(600)
    for i in range(300, 600):
        mem[i] += 2 * GIB  # a new buffer, once: the caching allocator keeps it
    losses = noisy(600, decay=0.01)
    assert "memory_leak" not in kinds(feed(records(losses, mem_allocated_bytes=mem), _cfg()))


def test_reserved_close_to_total_is_headroom_warning() -> None:
    reserved = [int(60 * GIB)] * 50 + [int(78.9 * GIB)] * 10
    got = raised(
        feed(records([1.0 + 0.01 * (i % 3) for i in range(60)], mem_reserved_bytes=reserved), _cfg())
    )
    assert [(a.kind, a.start_step, a.severity) for a in got] == [("memory_headroom", 51, "critical")]

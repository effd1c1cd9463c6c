"""Anomalies injected at known points into synthetic runs, one generator per kind.

Each injection is sized against the run's own noise (a spike is at least 8
noise units and 1.5x), because an anomaly smaller than the noise is not one a
person could see either; on fat-tailed shapes (batch size 1, "noisy") the
noise unit is 1.5 core sigmas, since the tails are part of what the eye sees.
``benchmarks/detection.py`` also sweeps spike sizes to show where recall ends. :data:`ACCEPT` lists the kinds
that count as catching
each injection, e.g. a vanishing gradient is caught by ``grad_vanishing`` or by
the ``plateau`` it causes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from steadytune.detect.synthetic import Run, base_run, healthy_system

FAULT_KINDS: tuple[str, ...] = (
    "nan_loss",
    "nonfinite_grad",
    "loss_spike",
    "divergence",
    "loss_collapse",
    "plateau",
    "oscillation",
    "grad_explosion",
    "grad_vanishing",
    "grad_spike",
    "memory_leak",
    "memory_headroom",
    "throughput_drop",
    "stall",
    "straggler",
    "gpu_thermal",
    "gpu_error",
    "dataloader_bottleneck",
    "disk_low",
    "overfitting",
)

ACCEPT: dict[str, frozenset[str]] = {k: frozenset({k}) for k in FAULT_KINDS} | {
    "loss_spike": frozenset({"loss_spike", "divergence"}),
    "plateau": frozenset({"plateau", "grad_vanishing"}),
    "grad_vanishing": frozenset({"grad_vanishing", "plateau"}),
    "grad_spike": frozenset({"grad_spike", "grad_explosion"}),
    "throughput_drop": frozenset({"throughput_drop", "dataloader_bottleneck"}),
    "dataloader_bottleneck": frozenset({"dataloader_bottleneck", "throughput_drop"}),
}

_BASES = ("smooth", "noisy", "bs1", "power_law", "warmup", "staircase", "irregular", "converged")


@dataclass
class Fault:
    """Where a fault was injected: point index ``start`` to ``end`` (inclusive) of ``run``."""

    kind: str
    run: Run
    start: int
    end: int
    note: str = ""
    oom_bytes: int | None = None  # memory_leak: the allocation at which half the headroom is gone


def _noise(run: Run) -> float:
    """The run's noise as a person reading the plot sees it: fat-tailed shapes look half again as wide."""
    return run.sigma * (1.5 if run.shape in ("bs1", "noisy") else 1.0)


def _jump(rng: random.Random, run: Run, lo: float = 1.5, hi: float = 4.0) -> float:
    """A multiplicative jump well outside the noise: >= 8 noise sigmas and >= ``lo``."""
    floor = max(math.log(lo), 8.0 * _noise(run))
    return math.exp(rng.uniform(floor, max(math.log(hi), 1.5 * floor)))


def _nan_loss(rng: random.Random, run: Run, i0: int) -> int:
    k = rng.randint(1, 5)
    for i in range(i0, min(run.n, i0 + k) if rng.random() < 0.5 else run.n):
        run.loss[i] = math.nan
    return min(run.n - 1, i0 + k - 1)


def _nonfinite_grad(rng: random.Random, run: Run, i0: int) -> int:
    k = rng.randint(1, 10)
    for i in range(i0, min(run.n, i0 + k)):
        run.grad[i] = math.inf if rng.random() < 0.5 else math.nan
    return min(run.n - 1, i0 + k - 1)


def _loss_spike(rng: random.Random, run: Run, i0: int) -> int:
    r, k = _jump(rng, run, 1.5, 6.0), rng.randint(1, 3)
    for j, i in enumerate(range(i0, min(run.n, i0 + k))):
        run.loss[i] *= r ** (1.0 - 0.3 * j)
    return min(run.n - 1, i0 + k - 1)


def _divergence(rng: random.Random, run: Run, i0: int) -> int:
    if rng.random() < 0.5:
        r = _jump(rng, run, 1.5, 5.0)
        for i in range(i0, run.n):
            run.loss[i] *= r * (1.0 + 0.01 * (i - i0))
    else:
        double_in = rng.uniform(10, 60)
        for i in range(i0, run.n):
            run.loss[i] *= 2.0 ** ((i - i0) / double_in)
    return run.n - 1


def _collapse(rng: random.Random, run: Run, i0: int) -> int:
    exact = rng.random() < 0.6
    for i in range(i0, run.n):
        run.loss[i] = 0.0 if exact else rng.uniform(1e-6, 1e-4)
    return run.n - 1


def _plateau(rng: random.Random, run: Run, i0: int) -> int:
    """No learning from the start (frozen model / LR zero): the loss wanders around its first value."""
    level = run.loss[0]
    for i in range(run.n):
        run.loss[i] = level * math.exp(rng.gauss(0, run.sigma))
    return run.n - 1


def _vanish(rng: random.Random, run: Run, i0: int) -> int:
    factor = 10.0 ** -rng.uniform(3, 5)
    level = run.loss[i0]
    for i in range(i0, run.n):
        ramp = min(1.0, (i - i0 + 1) / 3)
        g = run.grad[i]
        run.grad[i] = g * factor**ramp if g is not None else None
        run.loss[i] = level * math.exp(rng.gauss(0, run.sigma))
    return run.n - 1


def _oscillation(rng: random.Random, run: Run, i0: int) -> int:
    period = rng.randint(4, 16)
    amp = rng.uniform(max(0.1, 4 * _noise(run)), max(0.3, 8 * _noise(run)))
    shape = rng.choice(["sine", "triangle", "saw"])
    level = run.loss[i0]
    for i in range(i0, run.n):
        ph = ((i - i0) % period) / period
        w = {"sine": math.sin(2 * math.pi * ph), "triangle": 1 - 4 * abs(ph - 0.5), "saw": 2 * ph - 1}[shape]
        run.loss[i] = level * math.exp(amp * w + rng.gauss(0, run.sigma))
    return run.n - 1


def _grad_explosion(rng: random.Random, run: Run, i0: int) -> int:
    r = 10.0 ** rng.uniform(2, 4)
    for i in range(i0, run.n):
        g = run.grad[i]
        run.grad[i] = g * r * 1.2 ** (i - i0) if g is not None else None
        run.loss[i] *= _jump(rng, run, 1.5, 3.0) if i == i0 else 1.0 + 0.5 * min(1.0, (i - i0) / 5)
    return run.n - 1


def _grad_spike(rng: random.Random, run: Run, i0: int) -> int:
    r, k = 10.0 ** rng.uniform(1.2, 2), rng.randint(1, 2)
    for i in range(i0, min(run.n, i0 + k)):
        g = run.grad[i]
        run.grad[i] = g * r if g is not None else None
    return min(run.n - 1, i0 + k - 1)


def _memory_leak(rng: random.Random, run: Run, i0: int) -> int:
    base = run.mem_alloc[i0] or 0
    to_oom = rng.randint(150, 3000)
    rate = (run.total_bytes - base) / to_oom
    for i in range(i0, run.n):
        run.mem_alloc[i] = int((run.mem_alloc[i] or 0) + rate * (i - i0))
        run.mem_reserved[i] = max(run.mem_reserved[i] or 0, run.mem_alloc[i] or 0)
    _with_system(rng, run)
    return run.n - 1


def _memory_headroom(rng: random.Random, run: Run, i0: int) -> int:
    share = rng.uniform(0.95, 0.995)
    for i in range(i0, run.n):
        run.mem_reserved[i] = int(run.total_bytes * share)
    _with_system(rng, run)
    return run.n - 1


def _slower(rng: random.Random, run: Run, i0: int) -> int:
    f = rng.uniform(2.0, 4.0)
    for i in range(i0, run.n):
        run.step_time[i] *= f
    return run.n - 1


def _stall(rng: random.Random, run: Run, i0: int) -> int:
    run.stop_after = i0
    return i0


def _straggler(rng: random.Random, run: Run, i0: int) -> int:
    run.ranks = 4
    slow = rng.randrange(run.ranks)
    f = rng.uniform(1.6, 3.0)
    run.rank_slowdown[slow] = [1.0 if i < i0 else f for i in range(run.n)]
    return run.n - 1


def _gpu(rng: random.Random, run: Run, i0: int, what: str) -> int:
    _with_system(rng, run)
    t0 = run.times()[i0]
    gpu = rng.randrange(len(run.system[0].gpus))
    hot = rng.uniform(88, 97)
    errors = 0
    out = []
    for s in run.system:
        if s.ts < t0:
            out.append(s)
            continue
        if what == "error" and rng.random() < 0.3:
            errors += rng.randint(1, 3)
        gpus = tuple(
            replace(g, temperature_c=hot + rng.gauss(0, 1))
            if what == "thermal" and g.index == gpu
            else replace(g, ecc_errors=errors + 1)
            if what == "error" and g.index == gpu
            else g
            for g in s.gpus
        )
        out.append(replace(s, gpus=gpus))
    run.system = out
    return run.n - 1


def _dataloader(rng: random.Random, run: Run, i0: int) -> int:
    share = rng.uniform(0.4, 0.8)
    for i in range(run.n):
        s = 0.02 if i < i0 else share
        if i >= i0:
            run.step_time[i] /= 1.0 - share
        run.extra.setdefault(i, {})["data_time_s"] = s * run.step_time[i]
    return run.n - 1


def _disk_low(rng: random.Random, run: Run, i0: int) -> int:
    """Checkpoints fill the disk within a few tens of points, down to a few percent free."""
    _with_system(rng, run)
    times = run.times()
    t0, t1 = times[i0], times[min(run.n - 1, i0 + rng.randint(5, 40))]
    low = rng.uniform(0.003, 0.04)
    out = []
    for s in run.system:
        free = s.disk_free_bytes or 0
        if s.ts >= t0:
            frac = min(1.0, (s.ts - t0) / max(1.0, t1 - t0))
            free = int(free * (1 - frac) + (s.disk_total_bytes or 0) * low * frac)
        out.append(replace(s, disk_free_bytes=free))
    run.system = out
    return run.n - 1


def _overfitting(rng: random.Random, run: Run, i0: int) -> int:
    every = max(2, run.n // 20)
    final = min(run.loss[: max(1, i0)])
    run.eval_loss = {}
    rise = rng.uniform(0.08, 0.25)
    for i in range(every - 1, run.n, every):
        best = final * 1.2 * (1.0 + 0.2 * math.exp(-5 * i / run.n))
        if i >= i0:
            best *= 1.0 + rise * (i - i0) / max(1, run.n - i0)
        run.eval_loss[i] = best
    return run.n - 1


def _with_system(rng: random.Random, run: Run) -> None:
    if not run.system:
        run.system = healthy_system(rng, run)


_INJECT: dict[str, Callable[[random.Random, Run, int], int]] = {
    "nan_loss": _nan_loss,
    "nonfinite_grad": _nonfinite_grad,
    "loss_spike": _loss_spike,
    "divergence": _divergence,
    "loss_collapse": _collapse,
    "plateau": _plateau,
    "oscillation": _oscillation,
    "grad_explosion": _grad_explosion,
    "grad_vanishing": _vanish,
    "grad_spike": _grad_spike,
    "memory_leak": _memory_leak,
    "memory_headroom": _memory_headroom,
    "throughput_drop": _slower,
    "stall": _stall,
    "straggler": _straggler,
    "gpu_thermal": lambda rng, run, i0: _gpu(rng, run, i0, "thermal"),
    "gpu_error": lambda rng, run, i0: _gpu(rng, run, i0, "error"),
    "dataloader_bottleneck": _dataloader,
    "disk_low": _disk_low,
    "overfitting": _overfitting,
}


def make_fault(rng: random.Random, kind: str) -> Fault:
    """A healthy run of a random shape with one ``kind`` anomaly injected."""
    shape = rng.choice(_BASES)
    run = base_run(rng, shape, n=rng.randint(300, 1200))
    run.skipped.clear()
    i0 = 0 if kind == "plateau" else rng.randint(run.n // 3, (2 * run.n) // 3)
    end = _INJECT[kind](rng, run, i0)
    fault = Fault(kind, run, i0, end, note=shape)
    if kind == "memory_leak":
        base = run.mem_alloc[i0] or 0
        fault.oom_bytes = int(base + 0.5 * (run.total_bytes - base))
    return fault


def fault_runs(seed: int = 0, per_kind: int = 20) -> list[Fault]:
    """``per_kind`` runs with each kind of anomaly, reproducibly."""
    rng = random.Random(seed)
    return [make_fault(rng, kind) for kind in FAULT_KINDS for _ in range(per_kind)]

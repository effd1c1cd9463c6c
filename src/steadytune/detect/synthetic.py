"""A seeded generator of training runs: healthy curves of many shapes, for the tests and benchmarks.

A :class:`Run` is a plain list of per-point values (step, loss, grad norm, LR,
epoch, memory, step time) plus optional system samples; :func:`to_events`
turns it into the record stream a live detector sees. The healthy shapes are
the ones that must not trip a detector: smooth and noisy decays, batch-size-1
noise, LR warm-up, epoch staircases, epoch-periodic sawtooth, irregular
logging, very short runs, DPO losses, fp16 overflow skips, converged runs,
several ranks, and system samples with caching allocators and checkpoint
pauses. :mod:`.faults` injects anomalies into the same runs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from steadytune.detect.synthetic_rl import grpo_batches as grpo_batches  # RL runs: synthetic_rl
from steadytune.records import Anomaly, GpuSample, StepRecord, SystemSample

GIB = 1 << 30

HEALTHY_SHAPES: tuple[str, ...] = (
    "smooth",
    "noisy",
    "bs1",
    "power_law",
    "warmup",
    "staircase",
    "epoch_sawtooth",
    "irregular",
    "short",
    "dpo",
    "grpo",
    "fp16_skips",
    "converged",
    "multirank",
    "system",
)


@dataclass
class Run:
    """One synthetic run, point by point; lists are parallel, ``None`` means not logged."""

    shape: str
    steps: list[int]
    loss: list[float]
    grad: list[float | None]
    lr: list[float]
    epoch: list[float | None]
    step_time: list[float]
    mem_alloc: list[int | None] = field(default_factory=list)
    mem_reserved: list[int | None] = field(default_factory=list)
    eval_loss: dict[int, float] = field(default_factory=dict)
    skipped: set[int] = field(default_factory=set)
    extra: dict[int, dict[str, Any]] = field(default_factory=dict)
    ranks: int = 1
    rank_slowdown: dict[int, list[float]] = field(default_factory=dict)
    system: list[SystemSample] = field(default_factory=list)
    total_bytes: int = 80 * GIB
    stop_after: int | None = None  # index after which no records come (a stall)
    sigma: float = 0.0  # log-space noise of the loss, so faults can be sized against it

    @property
    def n(self) -> int:
        return len(self.steps)

    def times(self) -> list[float]:
        """Seconds since the start at which each point is logged (steps between points take time too)."""
        out, ts = [], 0.0
        base = sorted(self.step_time)[self.n // 2]
        for i in range(self.n):
            # The logged step takes its own time (a slow checkpoint step, say); the unlogged
            # steps before it take the usual time.
            gap = max(1, self.steps[i] - (self.steps[i - 1] if i else 0))
            ts += self.step_time[i] + (gap - 1) * base
            out.append(ts)
        return out

    @property
    def interval(self) -> int:
        gaps = sorted(b - a for a, b in zip(self.steps, self.steps[1:], strict=False))
        return gaps[len(gaps) // 2] if gaps else 1


def _lr_schedule(n: int, peak: float, warm: int, floor: float = 0.0) -> list[float]:
    out = []
    for i in range(n):
        if i < warm:
            out.append(peak * (i + 1) / warm)
        else:
            frac = (i - warm) / max(1, n - warm)
            out.append(floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * frac)))
    return out


def _noise(rng: random.Random, sigma: float, heavy: bool) -> float:
    """Log-space noise; ``heavy`` mixes in a wider component like per-sample losses have."""
    if heavy and rng.random() < 0.1:
        return rng.gauss(0.0, sigma * 2.0)
    return rng.gauss(0.0, sigma)


def _steps(rng: random.Random, n: int, interval: int, irregular: bool) -> list[int]:
    if not irregular:
        return [interval * (i + 1) for i in range(n)]
    out, s = [], 0
    for _ in range(n):
        s += rng.randint(1, 2 * interval + 1)
        out.append(s)
    return out


def base_run(rng: random.Random, shape: str, n: int | None = None) -> Run:
    """A healthy run of the given shape."""
    n = n or rng.randint(300, 1500)
    if shape == "short":
        n = rng.randint(3, 15)
    if shape == "power_law":
        n = rng.randint(1500, 4000)
    interval = 1 if shape in ("bs1", "dpo", "grpo", "fp16_skips") else rng.choice([1, 5, 10, 10, 25])
    steps = _steps(rng, n, interval, shape == "irregular")
    sigma = {
        "smooth": rng.uniform(0.004, 0.015),
        "bs1": rng.uniform(0.18, 0.35),
        "noisy": rng.uniform(0.04, 0.12),
    }.get(shape, rng.uniform(0.01, 0.08))
    heavy = shape in ("bs1", "noisy")
    start = rng.uniform(1.5, 4.0) if shape != "power_law" else rng.uniform(9.0, 11.0)
    final = start * rng.uniform(0.25, 0.7)
    tau = n * rng.uniform(0.05, 0.4)
    if shape == "converged":
        tau = n * rng.uniform(0.02, 0.06)
    warm = max(1, int(n * rng.uniform(0.02, 0.15))) if shape != "short" else 1
    lr = _lr_schedule(n, rng.choice([1e-5, 2e-5, 1e-4, 2e-4]), warm)
    epochs = rng.randint(3, 8) if shape in ("staircase", "epoch_sawtooth") else rng.choice([1, 1, 2, 3])
    total_steps = steps[-1]
    profile = [rng.uniform(-1, 1) for _ in range(6)]
    loss: list[float] = []
    for i, s in enumerate(steps):
        if shape == "power_law":
            clean = final + (start - final) * (1 + s / (0.01 * total_steps)) ** -0.7
        else:
            clean = final + (start - final) * math.exp(-i / tau)
        e = epochs * s / total_steps
        whole, phase = math.floor(e), e - math.floor(e)
        if shape == "staircase":
            clean *= (0.75**whole) * (1.0 - 0.08 * phase)
        elif shape == "epoch_sawtooth":
            wave = sum(p * math.sin((k + 1) * math.pi * phase) for k, p in enumerate(profile)) / 6
            clean *= (0.9**whole) * (1.0 + 0.15 * (1.0 - phase) + 0.04 * wave)
        if shape == "warmup" and i < warm:
            clean = start * (1.0 + 0.05 * math.sin(math.pi * i / warm))
        loss.append(clean * math.exp(_noise(rng, sigma, heavy)))
    if shape == "dpo":
        loss = _dpo_losses(rng, n)
    grad = _grad_norms(rng, n, warm)
    step_time = _step_times(rng, n)
    epoch: list[float | None] = [epochs * s / total_steps for s in steps]
    run = Run(shape, steps, loss, grad, lr, epoch, step_time, sigma=sigma)
    if shape == "dpo":
        # A DPO trainer logs its reward margin beside the loss (TRL: rewards/margins).
        run.extra = {
            i: {"rewards/margins": -math.log(math.expm1(x)) if x > 1e-12 else 30.0}
            for i, x in enumerate(loss)
        }
    if shape == "grpo":
        _grpo(rng, run)
    if shape == "fp16_skips":
        _fp16(rng, run)
    _memory(rng, run)
    if rng.random() < 0.3 or shape == "converged":
        _evals(rng, run, final)
    if shape == "multirank":
        run.ranks = rng.choice([2, 4, 8])
    if shape in ("system", "multirank"):
        run.system = healthy_system(rng, run)
    return run


def _grad_norms(rng: random.Random, n: int, warm: int) -> list[float | None]:
    """High during warm-up, then log-normal with fat tails (the occasional 1.5-3x batch)."""
    g0 = rng.uniform(0.3, 3.0)
    g_sigma = rng.uniform(0.1, 0.35)
    grad: list[float | None] = []
    for i in range(n):
        g = g0 * (1.0 + 4.0 * math.exp(-i / max(1.0, warm / 2))) * math.exp(rng.gauss(0.0, g_sigma))
        if rng.random() < 0.01:
            g *= rng.uniform(1.5, 3.0)
        grad.append(g)
    return grad


def _step_times(rng: random.Random, n: int) -> list[float]:
    """5% jitter around a base time, and now and then a step six times slower (a checkpoint save)."""
    base = rng.uniform(0.2, 2.0)
    return [base * math.exp(rng.gauss(0, 0.05)) * (6.0 if rng.random() < 0.005 else 1.0) for _ in range(n)]


def _dpo_losses(rng: random.Random, n: int) -> list[float]:
    """DPO: exactly ln 2 at first, then -log(sigmoid(margin)) with a widening, rising margin."""
    out = []
    flat = rng.randint(1, 4)
    mu_end, s_end = rng.uniform(1.0, 3.5), rng.uniform(0.7, 1.8)  # margins as wide as a real DPO log shows
    for i in range(n):
        if i < flat:
            out.append(math.log(2.0))
            continue
        t = min(1.0, i / (0.3 * n))
        m = rng.gauss(mu_end * t, 0.05 + s_end * t)
        out.append(math.log1p(math.exp(-m)))
    return out


def _grpo(rng: random.Random, run: Run) -> None:
    """A GRPO run's batches (:func:`grpo_batches`) in a few of the ways such runs are set up."""
    groups = rng.choice([1, 2, 4, 8, 16])
    beta = rng.choice([0.0, 0.001, 0.04])
    share_field = rng.random() < 0.7  # TRL logs frac_reward_zero_std since 0.17; older logs do not
    g0 = rng.uniform(0.05, 1.0)
    run.loss, run.grad, extra = grpo_batches(rng, len(run.steps), groups, beta, share_field, g0)
    run.extra = dict(enumerate(extra))


def _fp16(rng: random.Random, run: Run) -> None:
    """Overflow steps the scaler skipped: a burst at the start, then rare ones."""
    burst = rng.randint(0, 4)
    for i in range(run.n):
        if i < burst or rng.random() < rng.uniform(0.003, 0.02):
            run.grad[i] = math.inf if rng.random() < 0.5 else math.nan
            run.skipped.add(i)


def _memory(rng: random.Random, run: Run) -> None:
    """Allocated memory settles after warm-up; reserved grows in steps and plateaus (caching)."""
    total = rng.choice([24, 40, 80]) * GIB
    run.total_bytes = total
    base = int(total * rng.uniform(0.2, 0.5))
    settle = rng.randint(1, 10)
    reserved = base
    run.mem_alloc, run.mem_reserved = [], []
    for i in range(run.n):
        alloc = base * (0.6 + 0.4 * min(1.0, (i + 1) / settle))
        alloc *= 1.0 + rng.gauss(0, 0.003)
        if rng.random() < 0.02:
            alloc *= 1.05  # an eval or a long batch holds a little more for a moment
        if rng.random() < 0.01 and reserved < total * 0.85:
            reserved += int(total * 0.02)
        reserved = max(reserved, int(alloc))
        run.mem_alloc.append(int(alloc))
        run.mem_reserved.append(reserved)


def _evals(rng: random.Random, run: Run, final: float) -> None:
    every = max(2, run.n // rng.randint(5, 20))
    for i in range(every - 1, run.n, every):
        t = i / run.n
        run.eval_loss[i] = final * 1.1 * (1.0 + 0.3 * math.exp(-5 * t)) * math.exp(rng.gauss(0, 0.004))


def healthy_system(rng: random.Random, run: Run) -> list[SystemSample]:
    """Samples every ~10 s over the run: warm GPUs, a disk filling slowly, RAM half used."""
    out = []
    t_end = run.times()[-1]
    disk_total = 2000 * GIB
    free0 = disk_total * rng.uniform(0.3, 0.8)
    n_gpus = max(1, run.ranks)
    temp0 = rng.uniform(55, 78)
    t = 0.0
    while t <= t_end:
        gpus = tuple(
            GpuSample(
                index=g,
                temperature_c=temp0 + rng.gauss(0, 1.5),
                mem_used_bytes=int(run.total_bytes * 0.7),
                mem_total_bytes=run.total_bytes,
                util_ratio=rng.uniform(0.85, 1.0),
                ecc_errors=0,
                xid_errors=0,
            )
            for g in range(n_gpus)
        )
        out.append(
            SystemSample(
                ts=t,
                cpu_ratio=rng.uniform(0.2, 0.6),
                ram_used_bytes=int(512 * GIB * rng.uniform(0.4, 0.6)),
                ram_total_bytes=512 * GIB,
                disk_free_bytes=int(free0 - (t / max(t_end, 1.0)) * disk_total * 0.05),
                disk_total_bytes=disk_total,
                gpus=gpus,
            )
        )
        t += 10.0
    return out


def to_events(run: Run) -> list[tuple[str, Any]]:
    """The record stream of a run, in time order: ("step", rec), ("system", s), ("time", (now, hb, step))."""
    events: list[tuple[float, int, tuple[str, Any]]] = []
    last = run.n if run.stop_after is None else run.stop_after + 1
    times = run.times()
    ts = 0.0
    for i in range(last):
        ts = times[i]
        for rank in range(run.ranks):
            slow = run.rank_slowdown.get(rank)
            st = run.step_time[i] * (slow[i] if slow else 1.0) * (1.0 + 0.02 * rank / max(1, run.ranks))
            rec = StepRecord(
                step=run.steps[i],
                ts=ts,
                rank=rank,
                loss=run.loss[i],
                grad_norm=run.grad[i],
                lr=run.lr[i],
                epoch=run.epoch[i],
                step_time_s=st,
                tokens=4096,
                mem_allocated_bytes=run.mem_alloc[i] if run.mem_alloc else None,
                mem_reserved_bytes=run.mem_reserved[i] if run.mem_reserved else None,
                eval_loss=run.eval_loss.get(i),
                skipped=i in run.skipped,
                extra=dict(run.extra.get(i, {})),
            )
            events.append((ts, 1, ("step", rec)))
    for s in run.system:
        if run.stop_after is None or s.ts <= ts + 3600:
            events.append((s.ts, 0, ("system", s)))
            if run.stop_after is None and s.ts <= ts:
                # The supervisor's clock ticks too; heartbeats are alive in a healthy run.
                events.append((s.ts, 2, ("time", (s.ts, s.ts, None))))
    if run.stop_after is not None:
        for k in range(1, 121):
            now = ts + 30.0 * k
            events.append((now, 2, ("time", (now, ts, run.steps[last - 1]))))
    events.sort(key=lambda e: (e[0], e[1]))
    return [e[2] for e in events]


def healthy_runs(seed: int = 0, per_shape: int = 20) -> list[Run]:
    """``per_shape`` healthy runs of every shape, reproducibly."""
    rng = random.Random(seed)
    return [base_run(rng, shape) for shape in HEALTHY_SHAPES for _ in range(per_shape)]


def replay(run: Run, config: Any = None) -> list[tuple[Anomaly, float]]:
    """Feed a run to a fresh :class:`LiveDetector`; each raised anomaly with the time it was raised."""
    from steadytune.detect.live import LiveDetector

    det = LiveDetector(config)
    raised: list[tuple[Anomaly, float]] = []
    for kind, item in to_events(run):
        if kind == "step":
            now, transitions = item.ts, det.observe_step(item)
        elif kind == "system":
            now, transitions = item.ts, det.observe_system(item)
        else:
            now, transitions = item[0], det.observe_time(*item)
        raised.extend((t.anomaly, now) for t in transitions if t.state == "raised")
    return raised

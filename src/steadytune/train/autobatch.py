"""``per_device_train_batch_size: auto``: the largest micro-batch that fits, found at start.

1. The effective batch ``E`` (micro-batch x gradient accumulation) is fixed first:
   ``train.auto_effective_batch``, or the estimate's largest micro-batch x
   ``gradient_accumulation_steps``. Only divisors of ``E`` are candidates, so the
   accumulation ``E / b`` always keeps it exactly.
2. The estimator (:mod:`steadytune.estimate`, microseconds) picks the starting candidate.
3. Real forward/backward/optimizer steps confirm it: the search gallops from the start
   (up while it fits, down while it does not) and bisects once bracketed, so an accurate
   estimate costs two probes. A probe fits when its measured peak stays within the cap
   (CPU: ``torch.profiler`` allocator events, CUDA: ``max_memory_allocated`` plus the
   context and allocator margin) and it raised no out-of-memory error.

The cap is ``STEADYTUNE_MEMORY_CAP`` or ``train.memory_cap_bytes`` when set (that is how
the search is exercised on a CPU), else the free memory of the device minus headroom.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from steadytune.estimate import (
    Architecture,
    TrainSetup,
    estimate_peak,
    format_bytes,
    max_micro_batch,
    parse_bytes,
)
from steadytune.estimate.batch import auto_effective_batch, divisors
from steadytune.protocol import WorkerEvent

HEADROOM_BYTES = 1 << 30
MAX_PROBES = 8
CAP_ENV = "STEADYTUNE_MEMORY_CAP"


class AutoBatchError(RuntimeError):
    """Not even a micro-batch of 1 fits; the message says what was measured and what to change."""


@dataclass(frozen=True)
class Probe:
    batch: int
    peak_bytes: int | None  # None: out of memory
    fits: bool


@dataclass(frozen=True)
class AutoBatch:
    """What the search decided, and how."""

    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    effective_batch: int
    estimated_batch: int | None
    cap_bytes: int
    seq: int
    probes: tuple[Probe, ...]

    def message(self) -> str:
        tried = ", ".join(
            f"{p.batch}: {format_bytes(p.peak_bytes) if p.peak_bytes is not None else 'OOM'}"
            f" {'fits' if p.fits else 'too big'}"
            for p in self.probes
        )
        return (
            f"auto micro-batch {self.per_device_train_batch_size} x accumulation "
            f"{self.gradient_accumulation_steps} = effective batch {self.effective_batch} under "
            f"{format_bytes(self.cap_bytes)} (estimate: {self.estimated_batch}; measured at seq {self.seq}: "
            f"{tried or 'estimate only'})"
        )


def gallop_search(
    candidates: list[int], start: int, fits: Callable[[int], bool], max_probes: int = MAX_PROBES
) -> tuple[int | None, list[tuple[int, bool]]]:
    """The largest candidate that fits, probing as few as possible near ``start``.

    Args:
        candidates: increasing; ``fits`` must be monotone over them (true, then false).
        start: the first guess (the largest candidate <= start is probed first).
        fits: the probe.
        max_probes: stop after this many; the largest candidate confirmed so far wins.

    Returns:
        The largest confirmed fit (None when even the smallest does not fit) and every
        ``(candidate, fits)`` probed, in order.
    """
    below = [i for i, c in enumerate(candidates) if c <= start]
    i = below[-1] if below else 0
    lo, hi, step = -1, len(candidates), 1
    probed: list[tuple[int, bool]] = []
    while hi - lo > 1 and len(probed) < max_probes:
        good = fits(candidates[i])
        probed.append((candidates[i], good))
        if good:
            lo = i
        else:
            hi = i
        if hi - lo <= 1:
            break
        if hi == len(candidates):  # nothing failed yet: gallop up
            i, step = min(lo + step, hi - 1), step * 2
        elif lo == -1:  # nothing fitted yet: gallop down
            i, step = max(hi - step, 0), step * 2
        else:
            i = (lo + hi) // 2
    return (candidates[lo] if lo >= 0 else None), probed


def memory_cap(configured: int | None, env: dict[str, str] | None = None) -> int | None:
    """``STEADYTUNE_MEMORY_CAP`` (wins, so one invocation can override the file) or the config."""
    text = (env if env is not None else os.environ).get(CAP_ENV)
    return parse_bytes(text) if text else configured


def choose(
    arch: Architecture,
    setup: TrainSetup,
    cap: int,
    target_effective: int | None,
    measure: Callable[[int], int | None] | None,
    max_probes: int = MAX_PROBES,
) -> AutoBatch:
    """Pick the micro-batch and accumulation (pure given ``measure``).

    Args:
        arch: the model.
        setup: how it trains (device, seq, method, ...); batch and accumulation are chosen here.
        cap: bytes the step may use per device (for CUDA, including context and margin).
        target_effective: ``train.auto_effective_batch``; None derives it from the estimate.
        measure: the measured tensor peak of micro-batch ``b`` (None when it ran out of
            memory); None trusts the estimate (several processes, which must agree).
        max_probes: the most real probes.

    Raises:
        AutoBatchError: not even a micro-batch of 1 fits.
    """
    base = dataclasses.replace(setup, batch=1, gradient_accumulation_steps=1)
    estimated = max_micro_batch(arch, base, cap)
    effective = auto_effective_batch(
        arch, base, cap, target_effective, max(1, setup.gradient_accumulation_steps)
    )
    candidates = divisors(effective)
    cuda = setup.device == "cuda"

    def extra(b: int) -> int:
        # Accumulation keeps gradients alive across micro-batches; a measured step (which
        # zeroes them) does not see that, so the estimator's difference is added.
        one = dataclasses.replace(base, batch=b)
        many = dataclasses.replace(one, gradient_accumulation_steps=effective // b)
        return max(0, estimate_peak(arch, many).tensor_bytes - estimate_peak(arch, one).tensor_bytes)

    probes: list[Probe] = []

    def fits(b: int) -> bool:
        if measure is None:
            s = dataclasses.replace(base, batch=b, gradient_accumulation_steps=effective // b)
            return estimate_peak(arch, s).peak_bytes <= cap
        peak = measure(b)
        if peak is None:
            probes.append(Probe(b, None, False))
            return False
        total = peak + extra(b)
        if cuda:
            total = int(total * (1 + setup.allocator_margin)) + setup.cuda_context_bytes
        probes.append(Probe(b, total, total <= cap))
        return total <= cap

    best, _ = gallop_search(candidates, estimated or 1, fits, max_probes)
    if best is None:
        tried = ", ".join(
            f"{p.batch}: {format_bytes(p.peak_bytes) if p.peak_bytes else 'OOM'}" for p in probes
        )
        raise AutoBatchError(
            f"per_device_train_batch_size: auto found no micro-batch that fits {format_bytes(cap)} at "
            f"seq {setup.seq} "
            f"({tried or 'estimate'}); turn on train.gradient_checkpointing, lower data.max_seq_length, use "
            "LoRA/QLoRA, or raise the cap"
        )
    return AutoBatch(best, effective // best, effective, estimated, cap, setup.seq, tuple(probes))


def _measure_with(arch: Architecture, setup: TrainSetup) -> Callable[[int], int | None]:
    """Real steps on a randomly initialised copy of the model (same shapes, dtype, method)."""
    from steadytune.estimate.measure import measure_peak
    from steadytune.policy.restart import is_oom_message

    def measure(b: int) -> int | None:
        import torch

        try:
            return measure_peak(
                arch, dataclasses.replace(setup, batch=b, gradient_accumulation_steps=1), device=setup.device
            ).peak_bytes
        except Exception as exc:
            if isinstance(exc, torch.OutOfMemoryError) or is_oom_message(f"{type(exc).__name__}: {exc}"):
                return None
            raise
        finally:
            gc.collect()
            if setup.device == "cuda":
                torch.cuda.empty_cache()

    return measure


def longest_sample(cfg: Any) -> int:
    """Tokens in the longest training sample after truncation (the tokenized-data cache is reused)."""
    import pyarrow.compute as pc

    from steadytune.data.encode import DataSpec
    from steadytune.train.data import build_dataset, load_tokenizer

    d = cfg.data
    tok = load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
    ds = build_dataset(
        tok,
        DataSpec(d.train_file, d.format, d.text_field, d.max_seq_length, d.train_on_prompt, d.max_samples),
    )
    lengths = pc.list_value_length(ds.data.column("input_ids"))
    return int(pc.max(lengths).as_py() or d.max_seq_length)


def find_micro_batch(cfg: Any, world_size: int = 1, seq: int | None = None) -> AutoBatch:
    """Run the whole search for a run config (in the worker, before the trainer is built).

    Args:
        cfg: the :class:`~steadytune.config.schema.SteadytuneConfig`.
        world_size: processes training together; above 1 every rank must reach the same
            answer without talking, so the estimate alone decides, against the device's
            total memory (identical GPUs agree) or the cap.
        seq: the sequence length to size for; by default the longest sample in the data.
    """
    import torch

    from steadytune.estimate import load_architecture
    from steadytune.estimate.runconfig import setup_from_config_dict

    arch = load_architecture(cfg.model.name_or_path)
    use_cpu = cfg.train.use_cpu if cfg.train.use_cpu is not None else not torch.cuda.is_available()
    device = "cpu" if use_cpu else "cuda"
    _, setup = setup_from_config_dict(cfg.model_dump(), batch=1, device=device)
    setup = dataclasses.replace(setup, seq=min(seq or longest_sample(cfg), cfg.data.max_seq_length))
    cap = memory_cap(cfg.train.memory_cap_bytes)
    if cap is None:
        if device == "cuda":
            free, total = torch.cuda.mem_get_info()
            cap = (total if world_size > 1 else free) - HEADROOM_BYTES
        else:
            import psutil

            cap = int(psutil.virtual_memory().available) - 2 * HEADROOM_BYTES
    measure = _measure_with(arch, setup) if world_size == 1 else None
    return choose(arch, setup, cap, cfg.train.auto_effective_batch, measure)


def apply_auto_micro_batch(cfg: Any, plan: Any, guard: Any) -> Any:
    """Search, tell the supervisor (which writes the plan revision), and return the plan to train with.

    Rank 0 alone reports; every rank reaches the same answer (see :func:`find_micro_batch`).
    """
    found = find_micro_batch(cfg, world_size=int(os.environ.get("WORLD_SIZE", "1")))
    if guard.rank == 0:
        guard.notify(
            "action",
            WorkerEvent.AUTO_MICRO_BATCH,
            found.message(),
            severity="info",
            per_device_train_batch_size=found.per_device_train_batch_size,
            gradient_accumulation_steps=found.gradient_accumulation_steps,
            effective_batch=found.effective_batch,
            estimated_batch=found.estimated_batch,
            cap_bytes=found.cap_bytes,
            seq=found.seq,
            probes=[[p.batch, p.peak_bytes, p.fits] for p in found.probes],
        )
    return dataclasses.replace(
        plan,
        per_device_train_batch_size=found.per_device_train_batch_size,
        gradient_accumulation_steps=found.gradient_accumulation_steps,
    )

"""Resource checks: device memory (or RAM on a CPU-only host), RAM, disk, other GPU users, folders.

Pure: the estimate comes from :mod:`steadytune.estimate`, the host from a
:class:`~steadytune.preflight.probe.HostFacts` value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from steadytune.estimate import Architecture, TrainSetup, estimate_peak, format_bytes
from steadytune.estimate.setup import DTYPE_BYTES
from steadytune.estimate.states import optimizer_state_bytes, param_counts
from steadytune.preflight.probe import GpuInfo, HostFacts
from steadytune.preflight.result import Check, fail, na, ok, warn

DEFAULT_HEADROOM_BYTES = 1 << 30
# What a training process holds besides tensors: the interpreter, torch, transformers and their
# kernels. Measured: 475 MiB RSS after importing torch 2.13 (CPU build), transformers, peft and
# datasets; the demo worker trains at ~550 MiB. CUDA builds hold more once a context exists.
PROCESS_OVERHEAD_BYTES = 1 << 30
# trainer_state.json, scheduler.pt, rng_state.pth, training_args.bin: a few KiB each.
CHECKPOINT_SMALL_FILES_BYTES = 64 * 1024


@dataclass(frozen=True)
class Budget:
    """Where the run trains and how much memory one device may use."""

    device: str  # "cuda" or "cpu"
    bytes: int | None  # usable per device (free minus headroom); None when unknown
    devices: int = 1
    how: str = ""


def pick_device(use_cpu: bool | None, facts: HostFacts, device_memory: int | None) -> str:
    """``cuda`` when the run will (or, with --device-memory, is planned to) use GPUs."""
    if use_cpu:
        return "cpu"
    if device_memory is not None or facts.gpus or (facts.gpu_device_files and not facts.nvml):
        return "cuda"
    return "cpu"


def memory_check(
    arch: Architecture,
    setup: TrainSetup,
    facts: HostFacts,
    device: str,
    nproc: int,
    headroom: int = DEFAULT_HEADROOM_BYTES,
    device_memory: int | None = None,
    visible: tuple[GpuInfo, ...] | None = None,
) -> tuple[Check, Budget]:
    """Free device memory against the estimated peak plus headroom.

    On a CPU-only host the CPU estimate (no CUDA context) of every process is compared
    with free RAM: having no GPU is never a failure by itself.
    """
    f = "memory"
    s = dataclasses.replace(setup, device=device)
    peak = estimate_peak(arch, s).peak_bytes
    hr = format_bytes(headroom)
    if device == "cpu":
        return _ram_as_device_check(peak, facts.ram_available_bytes, nproc, headroom)

    if device_memory is not None:
        gpus: tuple[GpuInfo, ...] = tuple(
            GpuInfo(i, "planned", device_memory, device_memory) for i in range(nproc)
        )
        source = "free (--device-memory)"
    else:
        gpus = visible if visible is not None else facts.visible_gpus()
        source = "free (NVML)"
    if not gpus:
        return na(
            f,
            "device_memory",
            f"GPUs present but their memory cannot be read; estimated peak {format_bytes(peak)} per GPU",
            "pip install nvidia-ml-py (steadytune[gpu]) or pass --device-memory",
            peak_bytes=peak,
        ), Budget("cuda", None, nproc)
    if len(gpus) < nproc:
        return fail(
            f,
            "device_memory",
            f"run.nproc_per_node={nproc} but {len(gpus)} GPU(s) visible",
            f"set run.nproc_per_node to {len(gpus)} or make more GPUs visible (CUDA_VISIBLE_DEVICES)",
            peak_bytes=peak,
        ), Budget("cuda", None, nproc)
    used = gpus[:nproc]
    short = [g for g in used if g.free_bytes is None or g.free_bytes < peak + headroom]
    free = [g.free_bytes for g in used if g.free_bytes is not None]
    usable = min(free) - headroom if free else None
    b = Budget("cuda", usable, nproc, source)
    each = ", ".join(
        f"GPU {g.index} {format_bytes(g.free_bytes) if g.free_bytes is not None else 'N/A'}" for g in used
    )
    text = f"estimated peak {format_bytes(peak)} + headroom {hr} per GPU; {source}: {each}"
    data = {"peak_bytes": peak, "headroom_bytes": headroom, "free_bytes": free, "device": "cuda"}
    if short:
        # By how much: the size of the change to look for in the recommendation or the estimate's list.
        lacking = ", ".join(
            f"GPU {g.index} too small by {format_bytes(peak + headroom - g.free_bytes)}"
            if g.free_bytes is not None
            else f"GPU {g.index} too small (its free memory is unknown)"
            for g in short
        )
        return fail(
            f,
            "device_memory",
            f"{text}: {lacking}",
            "use the recommendation below, or a GPU with more memory"
            if device_memory is not None
            else "use the recommendation below, free the GPU, or pick another (CUDA_VISIBLE_DEVICES)",
            **data,
        ), b
    return ok(f, "device_memory", text + ": fits", **data), b


def _ram_as_device_check(peak: int, free_ram: int | None, nproc: int, headroom: int) -> tuple[Check, Budget]:
    """CPU-only: every process's CPU estimate (no CUDA context) against free RAM."""
    f = "memory"
    if free_ram is None:
        return na(f, "device_memory", "free RAM unknown"), Budget("cpu", None)
    need = nproc * (peak + PROCESS_OVERHEAD_BYTES)
    budget = (free_ram - headroom) // max(1, nproc) - PROCESS_OVERHEAD_BYTES
    text = (
        f"CPU-only: no GPU, so the CPU estimate {format_bytes(peak)}"
        f"{f' x {nproc} processes' if nproc > 1 else ''} (+{format_bytes(PROCESS_OVERHEAD_BYTES)} per "
        f"process) is compared with free RAM {format_bytes(free_ram)} (headroom {format_bytes(headroom)})"
    )
    data = {
        "peak_bytes": peak,
        "need_bytes": need,
        "free_bytes": free_ram,
        "headroom_bytes": headroom,
        "device": "cpu",
    }
    b = Budget("cpu", budget, nproc, "free RAM")
    if need + headroom > free_ram:
        return fail(
            f,
            "device_memory",
            text + ": does not fit",
            "use the recommendation below, a smaller model or method (LoRA/QLoRA), or a GPU",
            **data,
        ), b
    return ok(f, "device_memory", text + ": fits", **data), b


def ram_check(
    arch: Architecture,
    setup: TrainSetup,
    facts: HostFacts,
    device: str,
    nproc: int,
    model_file_bytes: int | None,
) -> Check:
    """Host RAM for loading the weights when training on GPUs (on CPU the memory check covers it)."""
    f = "memory"
    if facts.ram_available_bytes is None:
        return na(f, "ram", "free RAM unknown")
    avail = format_bytes(facts.ram_available_bytes)
    if device == "cpu":
        return ok(
            f,
            "ram",
            f"{avail} free of {format_bytes(facts.ram_total_bytes or 0)} (judged with the memory check)",
        )
    # transformers loads shard by shard, but a single-file checkpoint passes through RAM whole.
    weights = model_file_bytes or estimate_peak(arch, setup).breakdown.get("weights", 0)
    need = nproc * (weights + PROCESS_OVERHEAD_BYTES)
    text = f"{avail} free; loading needs up to {format_bytes(need)} ({nproc} process(es) x weights + runtime)"
    if facts.ram_available_bytes < need:
        return warn(f, "ram", text, "free host memory, or load with fewer processes at once", need_bytes=need)
    return ok(f, "ram", text, need_bytes=need)


def checkpoint_bytes(arch: Architecture, setup: TrainSetup, model_dtype: str) -> int:
    """Bytes of one HF Trainer checkpoint: saved weights (or adapter) + optimizer.pt + small files.

    Args:
        model_dtype: ``model.dtype`` of the config (``float32``, ``bfloat16``, ``float16``, ``auto``);
            full fine-tuning saves the weights in the dtype they train in.
    """
    one = dataclasses.replace(setup, gpus=1, zero_stage=0, fsdp=False)
    counts = param_counts(arch, one)
    if one.method == "full":
        dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(model_dtype, "fp32")
        weights = DTYPE_BYTES[dtype] * counts.total
    else:
        weights = DTYPE_BYTES[one.trainable_dtype] * counts.trainable
    return weights + optimizer_state_bytes(counts, one) + CHECKPOINT_SMALL_FILES_BYTES


def final_model_bytes(arch: Architecture, setup: TrainSetup, model_dtype: str) -> int:
    """What ``final/`` holds after a completed run: the weights or the adapter, no optimizer."""
    one = dataclasses.replace(setup, gpus=1, zero_stage=0, fsdp=False)
    counts = param_counts(arch, one)
    if one.method == "full":
        dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(model_dtype, "fp32")
        return DTYPE_BYTES[dtype] * counts.total
    return DTYPE_BYTES[one.trainable_dtype] * counts.trainable


def disk_needs(checkpoint: int, keep_last: int, final: int, min_free: int) -> int:
    """Disk a run needs in its runs folder: ``keep_last`` checkpoints plus LAST_GOOD (which
    retention never removes), the final model, and the floor below which saving is refused."""
    return checkpoint * (keep_last + 1) + final + min_free


def disk_check(facts: HostFacts, runs_need: int, cache_need: int, ckpt: int, keep_last: int) -> Check:
    """Free disk for checkpoints (runs folder) and the tokenized-data cache, together when they
    share a filesystem."""
    f = "system"
    runs, cache = facts.disks.get("runs_dir"), facts.disks.get("data_cache")
    if runs is None or runs.free_bytes is None:
        return na(f, "disk", "free disk of the runs folder unknown")
    text = (
        f"checkpoint ~{format_bytes(ckpt)} x (keep_last {keep_last} + 1) + final model + floor = "
        f"{format_bytes(runs_need)}"
    )
    shared = cache is not None and cache.device is not None and cache.device == runs.device
    need_runs = runs_need + (cache_need if shared else 0)
    if cache_need:
        text += f"; data cache +{format_bytes(cache_need)}" + (" (same disk)" if shared else "")
    text += f"; free {format_bytes(runs.free_bytes)} at {runs.path}"
    data = {"checkpoint_bytes": ckpt, "need_bytes": need_runs, "free_bytes": runs.free_bytes}
    if need_runs > runs.free_bytes:
        return fail(f, "disk", text, "free disk, lower run.keep_last, or move run.runs_dir", **data)
    if not shared and cache is not None and cache.free_bytes is not None and cache_need > cache.free_bytes:
        return fail(
            f,
            "disk",
            text + f"; the cache disk has {format_bytes(cache.free_bytes)}",
            "steadytune cache clean --max-size ..., or set STEADYTUNE_DATA_CACHE elsewhere",
            **data,
        )
    return ok(f, "disk", text, **data)


def gpu_process_check(facts: HostFacts, device: str, visible: tuple[GpuInfo, ...], nproc: int) -> Check:
    f = "system"
    if device != "cuda":
        return na(f, "gpu_processes", "no GPU in use")
    if not facts.nvml:
        return na(
            f, "gpu_processes", "N/A: NVML unavailable", "pip install nvidia-ml-py to see other GPU users"
        )
    used = visible[:nproc]
    if any(g.processes is None for g in used):
        return na(f, "gpu_processes", "NVML cannot list the processes on these GPUs")
    others = [(g.index, p) for g in used for p in (g.processes or ())]
    if not others:
        return ok(f, "gpu_processes", f"no other process on GPU {', '.join(str(g.index) for g in used)}")
    listed = "; ".join(
        f"GPU {i}: pid {p.pid} {p.name} {format_bytes(p.used_bytes) if p.used_bytes else ''}".strip()
        for i, p in others
    )
    return warn(
        f,
        "gpu_processes",
        f"other processes hold GPU memory ({listed})",
        "stop them, or pick free GPUs with CUDA_VISIBLE_DEVICES; they may grow and OOM this run",
        pids=[p.pid for _, p in others],
    )


def writable_checks(facts: HostFacts) -> list[Check]:
    out = []
    for label, reason in facts.writable.items():
        path = facts.disks[label].path if label in facts.disks else label
        if reason is None:
            out.append(ok("system", f"writable_{label}", f"{label} {path} is writable"))
        else:
            out.append(
                fail(
                    "system",
                    f"writable_{label}",
                    f"{label} {path}: {reason}",
                    f"fix the permissions or point {label} somewhere writable",
                )
            )
    return out

"""A per-process GPU memory cap: one job's overrun is its own clean OOM, not its neighbour's.

The server sets ``$STEADYTUNE_MEMORY_CAP_BYTES`` for a job submitted with
``--memory-cap-gib`` (docs/server.md). steadytune's worker, and the guard injected into
another tool's HF ``Trainer`` (``supervise --inject``), turn it into
``torch.cuda.set_per_process_memory_fraction`` on their device before training, so the
caching allocator refuses to grow past the cap and the job gets ``torch.OutOfMemoryError``
(which the guard's OOM split handles like any other), while the GPU still has room for the
jobs beside it. The cap bounds what PyTorch's allocator holds; the CUDA context and memory
taken outside the allocator (NCCL buffers, other libraries) are not counted in it.

The variable and its parsing are the job's environment (:mod:`steadytune.jobenv`), which the
server writes without this room. The arithmetic is torch-free, so it is tested without a GPU;
only :func:`apply_memory_cap` imports torch, and only when the variable is set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from steadytune.jobenv import MEMORY_CAP_ENV, parse_cap


def cap_fraction(cap_bytes: int, total_bytes: int) -> float | None:
    """The fraction of a device of ``total_bytes`` that ``cap_bytes`` is; None when it caps nothing.

    Raises:
        ValueError: a device of no memory (a reading gone wrong), or a cap of 0 or less.
    """
    if total_bytes <= 0:
        raise ValueError(f"the device reports {total_bytes} bytes of memory; cannot cap a share of it")
    if cap_bytes <= 0:
        raise ValueError(f"memory cap {cap_bytes} bytes: give a cap > 0")
    if cap_bytes >= total_bytes:
        return None  # the whole device: nothing to enforce
    return cap_bytes / total_bytes


def apply_memory_cap(environ: Mapping[str, str] | None = None, device: int | None = None) -> float | None:
    """Cap this process's allocator on ``device`` (default: the current one); returns the fraction set.

    Does nothing (None) without the variable or without CUDA.
    """
    env = os.environ if environ is None else environ
    cap = parse_cap(env.get(MEMORY_CAP_ENV))
    if cap is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device() if device is None else device
    fraction = cap_fraction(cap, torch.cuda.get_device_properties(index).total_memory)
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction

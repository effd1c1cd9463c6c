"""The environment a run (or a replay) happened in: Python, packages, torch/CUDA, driver, GPUs, OS.

A reading that is unavailable is ``None``, never an exception: a bundle made on
a CPU box says so instead of failing.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

KEY_PACKAGES = (
    "torch",
    "transformers",
    "peft",
    "trl",
    "accelerate",
    "datasets",
    "tokenizers",
    "safetensors",
    "bitsandbytes",
    "numpy",
    "steadytune",
)


def packages() -> list[str]:
    """``name==version`` of every installed distribution (what ``pip freeze`` would list), sorted."""
    seen: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")
        if name and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={dist.version}"
    return [seen[k] for k in sorted(seen)]


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_details() -> dict[str, Any]:
    """torch's build (CUDA, cuDNN) and the devices it sees. Imports torch."""
    try:
        import torch
    except ImportError:
        return {"torch": None}
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }
    if torch.cuda.is_available():
        out["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        out["capabilities"] = [
            list(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())
        ]
    return out


def nvml_details() -> dict[str, Any]:
    """Driver version and GPU names from NVML (no torch needed); empty without a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}
    try:

        def text(x: Any) -> str:
            return x.decode() if isinstance(x, bytes) else str(x)

        count = pynvml.nvmlDeviceGetCount()
        gpus = [text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
        return {"driver": text(pynvml.nvmlSystemGetDriverVersion()), "gpus": gpus}
    except Exception:
        return {}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def snapshot(with_torch: bool = True) -> dict[str, Any]:
    """Everything above in one JSON-ready dict. ``with_torch=False`` keeps torch out of this process."""
    env_keys = (
        "CUDA_VISIBLE_DEVICES",
        "CUBLAS_WORKSPACE_CONFIG",
        "OMP_NUM_THREADS",
        "PYTORCH_CUDA_ALLOC_CONF",
        "NCCL_ALGO",
        "TOKENIZERS_PARALLELISM",
    )
    return {
        "python": {
            "version": sys.version.split()[0],
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "os": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "key_packages": {n: _version(n) for n in KEY_PACKAGES},
        "torch": torch_details() if with_torch else {"torch": _version("torch")},
        "nvml": nvml_details(),
        "env": {k: os.environ[k] for k in env_keys if k in os.environ},
        "packages": packages(),
    }


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between two snapshots in ways that change numerics."""
    out = []
    for name, version in (recorded.get("key_packages") or {}).items():
        now = (current.get("key_packages") or {}).get(name)
        if version != now:
            out.append(f"{name} {version} -> {now}")
    rt, ct = recorded.get("torch") or {}, current.get("torch") or {}
    for key in ("cuda_build", "devices", "threads"):
        if key in rt and rt.get(key) != ct.get(key):
            out.append(f"torch {key} {rt.get(key)} -> {ct.get(key)}")
    if (recorded.get("nvml") or {}).get("driver") != (current.get("nvml") or {}).get("driver"):
        out.append(
            f"driver {(recorded.get('nvml') or {}).get('driver')} -> {(current.get('nvml') or {}).get('driver')}"
        )
    return out

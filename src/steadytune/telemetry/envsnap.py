"""The environment a run (or a replay) happened in: Python, packages, torch/CUDA, driver, GPUs, OS.

A reading that is unavailable is ``None``, never an exception: a bundle made on
a CPU box says so instead of failing.

This file imports only the standard library (torch lazily, when asked), so it also
runs as a script under any other interpreter: ``python envsnap.py [--no-torch]``
prints that interpreter's snapshot as JSON (see :func:`snapshot_of`). That is how a
supervised command's own Python is read, even where steadytune is not installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if (
    __name__ == "__main__"
    and sys.path
    and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__))
):
    # Run as a script, this folder comes first on sys.path, and its inspect.py would shadow the stdlib's.
    del sys.path[0]

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
        name = dist.metadata.get("Name")  # type: ignore[attr-defined]  # an email Message at run time
        if name and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={dist.version}"
    return [seen[k] for k in sorted(seen)]


def local_packages() -> dict[str, str]:
    """Distributions installed from a folder or a VCS, not from an index: ``name -> source``.

    A pinned ``name==version`` of these cannot be installed again from PyPI, so an
    export says so instead of writing a line that fails (PEP 610 ``direct_url.json``).
    """
    out: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")  # type: ignore[attr-defined]  # an email Message at run time
        raw = dist.read_text("direct_url.json")
        if not name or not raw or name.lower() in out:
            continue
        try:
            info = json.loads(raw)
        except ValueError:
            continue
        url = str(info.get("url", ""))
        if "vcs_info" in info:
            out[name.lower()] = f"vcs {info['vcs_info'].get('vcs', '')} {url}".strip()
        elif url.startswith("file:"):
            editable = (info.get("dir_info") or {}).get("editable")
            out[name.lower()] = ("editable " if editable else "local ") + url
    return out


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_dir(name: str) -> Path | None:
    """Where a top-level package lives, without executing it (``find_spec`` of a top-level package
    does not import it)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


# torch/version.py is generated at build time: ``cuda: Optional[str] = '12.8'``, ``hip = None``, ...
_BUILD_FIELDS = {"cuda": "cuda_build", "hip": "hip_build", "git_version": "git_version"}


def torch_build() -> dict[str, Any]:
    """torch's version and what it was built with, read from its files, never imported.

    Importing torch costs seconds of CPU; a supervisor reading a command's interpreter before the
    command starts would pay them once more on top of the command's own import. What only an
    imported torch can tell (cuDNN as loaded, the devices it sees) the worker adds once it runs
    (:func:`torch_details`, ``add_worker_details``); the GPUs and driver come from NVML either way.
    """
    out: dict[str, Any] = {"torch": _version("torch")}
    folder = package_dir("torch")
    if folder is None:
        return out
    try:
        text = (folder / "version.py").read_text(encoding="utf-8")
    except (OSError, ValueError):
        return out
    for name, key in _BUILD_FIELDS.items():
        m = re.search(rf"^{name}\s*(?::[^=\n]*)?=\s*(?:['\"]([^'\"]*)['\"]|None\b)", text, re.M)
        if m:
            out[key] = m.group(1)
    out["read_from"] = "files"
    return out


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
        "nccl": _nccl_version(torch),
        "threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }
    if torch.cuda.is_available():
        out["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        out["capabilities"] = [
            list(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())
        ]
    return out


def _nccl_version(torch: Any) -> str | None:
    # A CPU build has no NCCL at all (torch.cuda.nccl.version() raises there).
    try:
        v = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def nvidia_smi_details(timeout_s: float = 10.0) -> dict[str, Any]:
    """Driver version and GPU names from ``nvidia-smi``, for a machine without pynvml; empty without one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=timeout_s, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    rows = [r for r in rows if len(r) == 2]
    if not rows:
        return {}
    return {"driver": rows[0][1], "gpus": [r[0] for r in rows], "source": "nvidia-smi"}


def nvml_details() -> dict[str, Any]:
    """Driver version and GPU names from NVML (no torch needed), else nvidia-smi; empty without a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return nvidia_smi_details()
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
    """Everything above in one JSON-ready dict. ``with_torch=False`` keeps torch out of this process:
    its build is read from its files (:func:`torch_build`)."""
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
        "torch": torch_details() if with_torch else torch_build(),
        "nvml": nvml_details(),
        "env": {k: os.environ[k] for k in env_keys if k in os.environ},
        "packages": packages(),
        "local_packages": local_packages(),
    }


def snapshot_of(python: str, with_torch: bool = True, timeout_s: float = 120.0) -> dict[str, Any]:
    """The snapshot of another interpreter, taken by running this file under it.

    Returns:
        Its :func:`snapshot`, or ``{"error": ...}`` saying why it could not be read
        (no such interpreter, too old, it timed out): never an exception.
    """
    cmd = [python, os.path.abspath(__file__), *([] if with_torch else ["--no-torch"])]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"cannot run {python}: {exc}"}
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"{python} exited {done.returncode}: {tail[0][:300]}"}
    try:
        data = json.loads(done.stdout)
    except ValueError:
        return {"error": f"{python} did not print a JSON snapshot"}
    return data if isinstance(data, dict) else {"error": f"{python} did not print a JSON object"}


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
            f"driver {(recorded.get('nvml') or {}).get('driver')} -> "
            f"{(current.get('nvml') or {}).get('driver')}"
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    json.dump(snapshot(with_torch="--no-torch" not in args), sys.stdout, indent=1, default=str)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

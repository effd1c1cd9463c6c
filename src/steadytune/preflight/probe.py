"""Readings of the host the run would start on: GPUs (NVML), RAM, disks, writable folders.

This is the only impure part of the resource checks; everything it reads lands in a
:class:`HostFacts` value that the pure checks take, so tests pass a fake host. A
reading that is unavailable is None (N/A), never an exception.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steadytune.preflight.versions import Driver
from steadytune.telemetry.sampler import nvml_read


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None
    name: str = ""


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML sees it. ``processes`` is None when NVML cannot list them."""

    index: int
    name: str = ""
    free_bytes: int | None = None
    total_bytes: int | None = None
    processes: tuple[GpuProcess, ...] | None = None


@dataclass(frozen=True)
class DiskInfo:
    """Free space of the filesystem that holds ``path`` (or its nearest existing parent)."""

    path: str
    free_bytes: int | None
    total_bytes: int | None
    device: int | None = None  # st_dev, to tell whether two folders share a filesystem


@dataclass(frozen=True)
class HostFacts:
    """Everything the resource and version checks read from the machine."""

    ram_available_bytes: int | None = None
    ram_total_bytes: int | None = None
    gpus: tuple[GpuInfo, ...] = ()
    nvml: bool = False  # NVML answered (a machine without GPUs answers with zero GPUs)
    gpu_device_files: bool = False  # /dev/nvidia0 exists: there are GPUs even if NVML is missing
    driver: Driver = field(default_factory=Driver)
    disks: dict[str, DiskInfo] = field(default_factory=dict)
    writable: dict[str, str | None] = field(default_factory=dict)  # path -> None if writable, else why

    def visible_gpus(self, env: dict[str, str] | None = None) -> tuple[GpuInfo, ...]:
        """The GPUs a CUDA process would see, in CUDA order (``CUDA_VISIBLE_DEVICES``)."""
        spec = (env if env is not None else os.environ).get("CUDA_VISIBLE_DEVICES")
        if spec is None:
            return self.gpus
        by_index = {g.index: g for g in self.gpus}
        out = []
        for part in spec.split(","):
            part = part.strip()
            if part.isdigit() and int(part) in by_index:
                out.append(by_index[int(part)])
            elif part:
                break  # UUIDs and invalid entries: CUDA stops at the first it cannot use
        return tuple(out)


def existing_parent(path: Path) -> Path:
    """The path itself if it exists, else its nearest existing parent."""
    p = path.expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def disk_info(path: Path) -> DiskInfo:
    import shutil

    where = existing_parent(path)
    try:
        usage = shutil.disk_usage(where)
        return DiskInfo(str(path), int(usage.free), int(usage.total), where.stat().st_dev)
    except OSError:
        return DiskInfo(str(path), None, None, None)


def writable_reason(path: Path) -> str | None:
    """None when files can be created in ``path`` (or it can be created); else the reason.

    A real file is created and removed, because ``os.access`` is wrong on some network and
    read-only-bind filesystems.
    """
    where = existing_parent(path)
    if not where.is_dir():
        return f"{where} exists and is not a folder"
    try:
        fd, name = tempfile.mkstemp(prefix=".steadytune-check-", dir=where)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        return f"cannot create files in {where}: {exc.strerror or exc}"
    return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml() -> tuple[bool, tuple[GpuInfo, ...], Driver]:
    """GPUs, their free memory and processes, and the driver; lazily imports NVML."""
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception:
        return False, (), Driver()
    count = nvml_read(nv.nvmlDeviceGetCount) or 0
    gpus = []
    for i in range(count):
        h = nvml_read(nv.nvmlDeviceGetHandleByIndex, i)
        if h is None:
            continue
        mem = nvml_read(nv.nvmlDeviceGetMemoryInfo, h)
        procs = nvml_read(nv.nvmlDeviceGetComputeRunningProcesses, h)
        listed = None
        if procs is not None:
            listed = tuple(
                GpuProcess(
                    int(p.pid),
                    int(p.usedGpuMemory) if isinstance(p.usedGpuMemory, int) else None,
                    _process_name(int(p.pid)),
                )
                for p in procs
            )
        gpus.append(
            GpuInfo(
                i,
                _text(nvml_read(nv.nvmlDeviceGetName, h)) or "",
                int(mem.free) if mem is not None else None,
                int(mem.total) if mem is not None else None,
                listed,
            )
        )
    cuda = nvml_read(nv.nvmlSystemGetCudaDriverVersion)  # e.g. 12040 for 12.4
    driver = Driver(
        driver_version=_text(nvml_read(nv.nvmlSystemGetDriverVersion)),
        cuda_driver_version=f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) else None,
        gpu_count=len(gpus),
    )
    nvml_read(nv.nvmlShutdown)
    return True, tuple(gpus), driver


def _process_name(pid: int) -> str:
    try:
        import psutil

        return psutil.Process(pid).name()
    except Exception:
        return ""


def probe_host(paths: dict[str, Path]) -> HostFacts:
    """Read the machine: RAM (psutil), GPUs and driver (NVML), disks and writability of ``paths``.

    Args:
        paths: label -> folder, e.g. ``{"runs_dir": ..., "cache": ...}``.
    """
    import psutil

    vm = psutil.virtual_memory()
    nvml, gpus, driver = read_nvml()
    return HostFacts(
        ram_available_bytes=int(vm.available),
        ram_total_bytes=int(vm.total),
        gpus=gpus,
        nvml=nvml,
        gpu_device_files=Path("/dev/nvidia0").exists(),
        driver=driver,
        disks={label: disk_info(p) for label, p in paths.items()},
        writable={label: writable_reason(p) for label, p in paths.items()},
    )

"""Fixtures for the preflight's unit tests: the demo architecture, configs and fake hosts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from steadytune.config.load import validate_dict
from steadytune.config.schema import SteadytuneConfig
from steadytune.estimate import Architecture
from steadytune.preflight.probe import DiskInfo, GpuInfo, HostFacts

GiB = 1 << 30
MiB = 1 << 20

# The shapes of the demo model (steadytune.train.assets.build_model), without building it.
DEMO = Architecture(
    "llama",
    hidden_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    intermediate_size=256,
    vocab_size=512,
    max_position_embeddings=256,
)


@pytest.fixture
def demo_arch() -> Architecture:
    return DEMO


def make_config(tmp: Path, **sections: dict[str, Any]) -> SteadytuneConfig:
    """A valid config on paths that need not exist (the checks under test do not read them)."""
    data: dict[str, Any] = {
        "model": {"name_or_path": str(tmp / "model")},
        "method": "lora",
        "data": {"train_file": str(tmp / "train.jsonl"), "max_seq_length": 128},
        "train": {
            "learning_rate": 2e-4,
            "per_device_train_batch_size": 4,
            "max_steps": 100,
            "save_steps": 25,
        },
        "run": {"runs_dir": str(tmp / "runs")},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return validate_dict(data, base=tmp, check_paths=False)


def host(
    ram_free: int = 16 * GiB,
    gpus: tuple[GpuInfo, ...] = (),
    nvml: bool = False,
    disk_free: int = 100 * GiB,
    writable: dict[str, str | None] | None = None,
) -> HostFacts:
    disks = {
        "runs_dir": DiskInfo("/runs", disk_free, 500 * GiB, 1),
        "data_cache": DiskInfo("/cache", disk_free, 500 * GiB, 1),
    }
    return HostFacts(
        ram_available_bytes=ram_free,
        ram_total_bytes=32 * GiB,
        gpus=gpus,
        nvml=nvml or bool(gpus),
        disks=disks,
        writable=writable if writable is not None else {"runs_dir": None},
    )

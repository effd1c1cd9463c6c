"""Resource checks on fake hosts: exact budgets, CPU-only never fails for lack of a GPU."""

from __future__ import annotations

import dataclasses

from steadytune.estimate import TrainSetup, estimate_peak
from steadytune.preflight.probe import GpuInfo, GpuProcess, HostFacts
from steadytune.preflight.resources import (
    CHECKPOINT_SMALL_FILES_BYTES,
    PROCESS_OVERHEAD_BYTES,
    checkpoint_bytes,
    disk_check,
    disk_needs,
    gpu_process_check,
    memory_check,
    pick_device,
    writable_checks,
)

from .conftest import DEMO, GiB, MiB, host

FULL = TrainSetup(method="full", dtype="fp32", mixed_precision=False, batch=8, seq=128)


def test_device_choice() -> None:
    assert pick_device(None, host(), None) == "cpu"
    assert pick_device(None, host(gpus=(GpuInfo(0, "H100", 80 * GiB, 80 * GiB),)), None) == "cuda"
    assert pick_device(True, host(gpus=(GpuInfo(0, "H100", 80 * GiB, 80 * GiB),)), None) == "cpu"
    assert pick_device(None, host(), 24 * GiB) == "cuda"  # planning for a GPU from a laptop
    assert pick_device(None, HostFacts(gpu_device_files=True), None) == "cuda"  # GPUs without NVML


def test_cpu_only_compares_the_cpu_estimate_with_free_ram() -> None:
    check, budget = memory_check(DEMO, FULL, host(ram_free=8 * GiB), "cpu", 1, headroom=GiB)
    peak = estimate_peak(DEMO, dataclasses.replace(FULL, device="cpu")).peak_bytes
    assert check.status == "ok" and "CPU-only" in check.reason and "free RAM" in check.reason
    assert check.data["peak_bytes"] == peak and check.data["device"] == "cpu"
    assert budget.bytes == 8 * GiB - GiB - PROCESS_OVERHEAD_BYTES


def test_cpu_only_fails_only_when_ram_is_short() -> None:
    peak = estimate_peak(DEMO, dataclasses.replace(FULL, device="cpu")).peak_bytes
    just_enough = peak + PROCESS_OVERHEAD_BYTES + GiB
    assert memory_check(DEMO, FULL, host(ram_free=just_enough), "cpu", 1, GiB)[0].status == "ok"
    short = memory_check(DEMO, FULL, host(ram_free=just_enough - 1), "cpu", 1, GiB)[0]
    assert short.status == "fail" and "does not fit" in short.reason


def test_each_gpu_must_hold_the_peak_plus_headroom() -> None:
    setup = dataclasses.replace(FULL, device="cuda")
    peak = estimate_peak(DEMO, setup).peak_bytes
    gpus = (GpuInfo(0, "A", peak + GiB, 80 * GiB), GpuInfo(1, "B", peak + GiB - 1, 80 * GiB))
    one, budget = memory_check(DEMO, setup, host(gpus=gpus), "cuda", 1, GiB, visible=gpus)
    assert one.status == "ok" and budget.bytes == peak
    two, budget = memory_check(DEMO, setup, host(gpus=gpus), "cuda", 2, GiB, visible=gpus)
    assert two.status == "fail" and "GPU 1 too small by 1 B" in two.reason and budget.bytes == peak - 1
    assert "GPU 0 too small" not in two.reason and "pick another" in two.fix
    three, _ = memory_check(DEMO, setup, host(gpus=gpus), "cuda", 3, GiB, visible=gpus)
    assert three.status == "fail" and "nproc_per_node=3" in three.reason


def test_planned_device_memory_and_unreadable_gpus() -> None:
    planned, budget = memory_check(DEMO, FULL, host(), "cuda", 1, GiB, device_memory=24 * GiB)
    assert planned.status == "ok" and "--device-memory" in planned.reason and budget.bytes == 23 * GiB
    # A plan for a card that is too small says by how much, and does not ask to free a GPU it never read.
    small, _ = memory_check(DEMO, FULL, host(), "cuda", 1, GiB, device_memory=1024)
    assert small.status == "fail" and small.reason.count("free (--device-memory): GPU 0 1.00 KiB") == 1
    assert "GPU 0 too small by " in small.reason and "free the GPU" not in small.fix
    unknown, budget = memory_check(DEMO, FULL, HostFacts(gpu_device_files=True), "cuda", 1, GiB, visible=())
    assert unknown.status == "na" and budget.bytes is None


def test_visible_gpus_follow_cuda_visible_devices() -> None:
    facts = host(gpus=tuple(GpuInfo(i) for i in range(4)))
    assert [g.index for g in facts.visible_gpus({"CUDA_VISIBLE_DEVICES": "2,0"})] == [2, 0]
    assert [g.index for g in facts.visible_gpus({})] == [0, 1, 2, 3]
    assert facts.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == ()


def test_checkpoint_size_is_weights_plus_optimizer_states() -> None:
    p = DEMO.total_params
    assert checkpoint_bytes(DEMO, FULL, "float32") == 4 * p + 8 * p + CHECKPOINT_SMALL_FILES_BYTES
    assert checkpoint_bytes(DEMO, FULL, "bfloat16") == 2 * p + 8 * p + CHECKPOINT_SMALL_FILES_BYTES
    lora = TrainSetup(method="lora", lora_r=8, target_modules=("q_proj", "v_proj"))
    adapter = 2 * 8 * ((128 + 128) + (128 + 64))  # two layers, q (128->128) and v (128->64)
    assert (
        checkpoint_bytes(DEMO, lora, "bfloat16") == 4 * adapter + 8 * adapter + CHECKPOINT_SMALL_FILES_BYTES
    )


def test_disk_needs_keep_last_plus_last_good() -> None:
    assert (
        disk_needs(100 * MiB, keep_last=3, final=50 * MiB, min_free=256 * MiB)
        == 400 * MiB + 50 * MiB + 256 * MiB
    )


def test_disk_check_adds_the_cache_when_it_shares_the_disk() -> None:
    facts = host(disk_free=GiB)
    assert disk_check(facts, 900 * MiB, 100 * MiB, 10 * MiB, 3).status == "ok"
    short = disk_check(facts, 900 * MiB, 125 * MiB, 10 * MiB, 3)
    assert short.status == "fail" and short.data["need_bytes"] == 1025 * MiB


def test_other_gpu_processes_warn_and_no_nvml_is_na() -> None:
    busy = (GpuInfo(0, "H100", 40 * GiB, 80 * GiB, (GpuProcess(4242, 30 * GiB, "python"),)),)
    found = gpu_process_check(host(gpus=busy), "cuda", busy, 1)
    assert found.status == "warn" and "4242" in found.reason and found.data["pids"] == [4242]
    free = (GpuInfo(0, "H100", 80 * GiB, 80 * GiB, ()),)
    assert gpu_process_check(host(gpus=free), "cuda", free, 1).status == "ok"
    assert gpu_process_check(HostFacts(), "cuda", (), 1).status == "na"
    assert gpu_process_check(host(), "cpu", (), 1).status == "na"


def test_unwritable_folder_fails_with_the_reason() -> None:
    facts = host(writable={"runs_dir": "cannot create files in /runs: Permission denied"})
    (found,) = writable_checks(facts)
    assert found.status == "fail" and "Permission denied" in found.reason

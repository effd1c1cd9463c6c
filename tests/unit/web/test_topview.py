"""`steadytune top`: GPU rows from (fake) NVML, runs from status.json + record tails, one frame."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from steadytune.cli.main import main
from steadytune.records import Event, StepRecord
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web.topview import frame, read_gpus, scan_runs


class FakeNvml:
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=40 << 30, total=80 << 30)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=87)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 71

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        raise RuntimeError("not supported")  # a missing reading is N/A, not a crash


def _runs(tmp_path: Path) -> Path:
    run = RunDir(tmp_path / "runs" / "r1").create()
    with JsonlWriter(run.telemetry(0)) as w:
        for s in range(30):
            w.write(StepRecord(step=s, ts=float(s), loss=3.0 - s * 0.05, tokens=4000, step_time_s=0.5))
    EventLog(run.events, run_id="r1").append(
        Event(ts=1.0, kind="anomaly", name="loss_spike", severity="warning", step=12)
    )
    atomic_write_text(run.status, json.dumps({"state": "running", "step": 29, "max_steps": 100}))
    return tmp_path / "runs"


def test_gpu_rows_from_nvml() -> None:
    (g,) = read_gpus(FakeNvml())  # type: ignore[misc]
    assert (g.name, g.util_ratio, g.temperature_c, g.power_w) == ("NVIDIA H100", 0.87, 71, None)


class _NoDriver:
    """nvidia-ml-py installed on a host without a driver: its init fails."""

    def nvmlInit(self) -> None:
        raise RuntimeError("NVML Shared Library Not Found")


def test_a_host_without_a_driver_is_not_told_to_install_the_extra(tmp_path: Path) -> None:
    console = Console(width=140, record=True)
    console.print(frame(read_gpus(_NoDriver()), [], tmp_path))
    text = console.export_text()
    assert "found no NVIDIA driver or GPU" in text and "steadytune[gpu]" not in text


def test_frame_shows_gpus_and_runs(tmp_path: Path) -> None:
    runs_dir = _runs(tmp_path)
    (run,) = scan_runs(runs_dir)
    assert (run.step, run.tokens_per_s, run.anomaly) == (29, 8000.0, "warning loss_spike @ 12")
    console = Console(width=140, record=True)
    console.print(frame(read_gpus(FakeNvml()), [run], runs_dir))
    text = console.export_text()
    assert "NVIDIA H100" in text and "87%" in text and "71°C" in text and "N/A" in text
    assert "r1" in text and "29/100" in text and "1.5500" in text and "loss_spike" in text


def test_top_once_cli(tmp_path: Path, capsys) -> None:
    assert main(["top", str(_runs(tmp_path)), "--once"]) == 0
    out = capsys.readouterr().out
    assert "r1" in out and "running" in out and "GPUs" in out


def test_a_nested_line_in_a_tail_is_skipped_not_a_crash(tmp_path: Path) -> None:
    runs_dir = _runs(tmp_path)
    run = RunDir(runs_dir / "r1")
    for path in (run.telemetry(0), run.events):
        with open(path, "a") as f:
            f.write("[" * 30_000 + "\n")
    (row,) = scan_runs(runs_dir)
    assert (row.step, row.anomaly) == (29, "warning loss_spike @ 12")

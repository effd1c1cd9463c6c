"""``steadytune top``'s model and frame: GPUs (NVML, lazily) and the runs on this machine.

Reads only ``status.json`` and the tails of the JSONL files (no index is
built), so it is cheap enough to refresh every second over many runs. A
reading that is unavailable is shown as N/A, never raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from steadytune.rundir import RunDir, looks_like_run, valid_run_id
from steadytune.telemetry.jsonl import tail_dicts
from steadytune.telemetry.progress import mean_tokens_per_s
from steadytune.telemetry.sampler import nvml_read
from steadytune.web.runs import read_json
from steadytune.web.sparkline import sparkline

NA = "N/A"


@dataclass(frozen=True)
class GpuRow:
    index: int
    name: str
    util_ratio: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None


@dataclass
class RunRow:
    run_id: str
    state: str = "unknown"
    step: int | None = None
    max_steps: int | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    anomaly: str | None = None
    losses: list[float] = field(default_factory=list)


def read_gpus(nvml: Any = None) -> list[GpuRow] | str:
    """Every GPU via NVML; where there is none to read, why, in words: the extra not installed is
    not the same fix as no driver or no GPU (it said to install the extra where it was installed)."""
    if nvml is None:
        try:
            import pynvml  # lazily: optional extra `steadytune[gpu]`
        except ImportError:
            return "N/A (no NVML: install steadytune[gpu] and an NVIDIA driver)"
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception:
        return "N/A (NVML is installed but found no NVIDIA driver or GPU)"
    rows: list[GpuRow] = []
    try:
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml_read(nvml.nvmlDeviceGetName, h)
            mem = nvml_read(nvml.nvmlDeviceGetMemoryInfo, h)
            util = nvml_read(nvml.nvmlDeviceGetUtilizationRates, h)
            temp = nvml_read(nvml.nvmlDeviceGetTemperature, h, 0)
            power = nvml_read(nvml.nvmlDeviceGetPowerUsage, h)
            rows.append(
                GpuRow(
                    index=i,
                    name=name.decode() if isinstance(name, bytes) else str(name or ""),
                    util_ratio=None if util is None else util.gpu / 100.0,
                    mem_used_bytes=None if mem is None else int(mem.used),
                    mem_total_bytes=None if mem is None else int(mem.total),
                    temperature_c=temp,
                    power_w=None if power is None else power / 1000.0,
                )
            )
    finally:
        nvml_read(nvml.nvmlShutdown)
    return rows


def read_run(root: Path) -> RunRow:
    run = RunDir(root)
    status = read_json(run.status) or {}
    row = RunRow(
        run_id=run.run_id,
        state=status.get("state") or "unknown",
        step=status.get("step"),
        max_steps=status.get("max_steps"),
        loss=status.get("loss"),
        tokens_per_s=status.get("tokens_per_s"),
    )
    files = run.telemetry_files()
    steps = [d for d in tail_dicts(files[0]) if d.get("type") == "step"] if files else []
    if steps:
        last = steps[-1]
        row.step = max(row.step or 0, int(last.get("step", 0)))
        loss = last.get("loss")
        row.loss = loss if loss is not None else row.loss
        if row.tokens_per_s is None:  # no supervisor's figure: the same mean, over the steps read
            timed = [d for d in steps if d.get("tokens") and d.get("step_time_s")]
            row.tokens_per_s = mean_tokens_per_s(
                sum(d["tokens"] for d in timed), sum(d["step_time_s"] for d in timed)
            )
        row.losses = [float(d["loss"]) for d in steps if isinstance(d.get("loss"), (int, float))]
    for d in reversed(tail_dicts(run.events)):
        if d.get("type") == "event" and d.get("kind") == "anomaly":
            row.anomaly = f"{d.get('severity', '')} {d.get('name', '')} @ {d.get('step', '?')}".strip()
            break
    return row


def scan_runs(runs_dir: Path) -> list[RunRow]:
    try:
        children = sorted(p for p in Path(runs_dir).iterdir() if valid_run_id(p.name) and looks_like_run(p))
    except OSError:
        return []
    return [read_run(p) for p in children]


def _fmt(v: float | None, spec: str) -> str:
    return NA if v is None else format(v, spec)


def _gib(v: int | None) -> str:
    return NA if v is None else f"{v / (1 << 30):.1f}"


def frame(gpus: list[GpuRow] | str, runs: list[RunRow], runs_dir: Path) -> Group:
    """One screen of ``top``: a GPU table and a runs table."""
    g = Table(title="GPUs", title_justify="left", expand=True)
    for col in ("#", "name", "util", "memory (GiB)", "temp", "power"):
        g.add_column(col, justify="right" if col not in ("name",) else "left")
    if isinstance(gpus, str):
        g.add_row("–", Text(gpus), NA, NA, NA, NA)
    for x in [] if isinstance(gpus, str) else gpus:
        mem = f"{_gib(x.mem_used_bytes)} / {_gib(x.mem_total_bytes)}"
        util = NA if x.util_ratio is None else f"{x.util_ratio * 100:.0f}%"
        temp = NA if x.temperature_c is None else f"{x.temperature_c:.0f}°C"
        power = NA if x.power_w is None else f"{x.power_w:.0f} W"
        g.add_row(str(x.index), Text(x.name), util, mem, temp, power)
    r = Table(title=f"Runs in {runs_dir}", title_justify="left", expand=True)
    for col in ("run", "state", "step", "loss", "tokens/s", "latest anomaly", "loss trend"):
        r.add_column(col, justify="right" if col in ("step", "loss", "tokens/s") else "left")
    colors = {
        "running": "green",
        "failed": "red",
        "restarting": "yellow",
        "paused": "yellow",
        "completed": "blue",
    }
    for run in runs:
        step = NA if run.step is None else (f"{run.step}/{run.max_steps}" if run.max_steps else str(run.step))
        r.add_row(
            run.run_id,
            Text(run.state, style=colors.get(run.state, "dim")),
            step,
            _fmt(run.loss, ".4f"),
            _fmt(run.tokens_per_s, ",.0f"),
            Text(run.anomaly or "–", style="yellow" if run.anomaly else "dim"),
            sparkline(run.losses, 20),
        )
    if not runs:
        r.add_row("(no runs)", "", "", "", "", "", "")
    return Group(g, r, Text("q or Ctrl-C to quit", style="dim"))

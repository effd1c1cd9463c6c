"""``/metrics``: the Prometheus text exposition (format 0.0.4), written by hand.

Every family is ``steadytune_*`` with a unit suffix and a ``run`` label. Values
come only from the run directory: ``status.json``, the run index and the
checkpoint pointers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from steadytune.web.runs import RunEntry, RunsIndex, read_pointer

STATES = ("starting", "running", "restarting", "paused", "completed", "failed", "stopped", "unknown")


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


@dataclass
class Family:
    name: str
    type: str  # gauge | counter
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: Any, **labels: Any) -> None:
        if value is None:
            return
        try:
            v = float(value)
        except (TypeError, ValueError):
            return
        self.samples.append(({k: str(x) for k, x in labels.items()}, v))


def render(families: Iterable[Family]) -> str:
    """The exposition text; families without samples are left out."""
    out: list[str] = []
    for fam in families:
        if not fam.samples:
            continue
        out.append(f"# HELP {fam.name} {fam.help}")
        out.append(f"# TYPE {fam.name} {fam.type}")
        for labels, value in fam.samples:
            if labels:
                body = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
                out.append(f"{fam.name}{{{body}}} {format_value(value)}")
            else:
                out.append(f"{fam.name} {format_value(value)}")
    return "\n".join(out) + "\n"


class _Families:
    """The families of one scrape, created in a fixed order so the output is stable."""

    SPEC: tuple[tuple[str, str, str], ...] = (
        ("run_state", "gauge", "1 for the run's current state (starting, running, ..., failed)."),
        ("run_attempt", "gauge", "Attempt number of the current worker (0 = first start)."),
        ("step", "gauge", "Latest optimizer step."),
        ("max_steps", "gauge", "Planned number of optimizer steps."),
        ("progress_ratio", "gauge", "step / max_steps."),
        ("eta_seconds", "gauge", "Estimated time to the last step."),
        ("loss", "gauge", "Training loss of the latest step (NaN when it was not finite)."),
        ("eval_loss", "gauge", "Latest evaluation loss."),
        ("grad_norm", "gauge", "Gradient norm of the latest step."),
        ("learning_rate", "gauge", "Learning rate of the latest step."),
        ("loss_nonfinite", "gauge", "1 when the latest step's loss or grad norm was NaN/Inf."),
        ("nonfinite_steps_total", "counter", "Steps whose loss or grad norm was NaN/Inf."),
        ("tokens_total", "counter", "Tokens trained on (latest attempt of every step)."),
        ("throughput_tokens_per_second", "gauge", "Tokens per second of the latest step."),
        ("step_duration_seconds", "gauge", "Wall time of the latest step."),
        ("last_step_timestamp_seconds", "gauge", "Unix time of the latest step record."),
        ("status_updated_timestamp_seconds", "gauge", "Unix time the supervisor last wrote status.json."),
        ("device_memory_allocated_bytes", "gauge", "Device memory allocated by the worker (rank 0)."),
        ("device_memory_reserved_bytes", "gauge", "Device memory reserved by the allocator (rank 0)."),
        ("device_memory_peak_bytes", "gauge", "Peak device memory of the latest step (rank 0)."),
        ("anomalies_total", "counter", "Anomalies detected, by kind and severity."),
        ("anomalies_active", "gauge", "Anomalies raised and not yet resolved, by kind and severity."),
        ("restarts_total", "counter", "Worker restarts, by reason."),
        ("gpu_utilization_ratio", "gauge", "GPU utilization, 0..1."),
        ("gpu_memory_used_bytes", "gauge", "GPU memory in use."),
        ("gpu_memory_total_bytes", "gauge", "GPU memory capacity."),
        ("gpu_memory_headroom_ratio", "gauge", "Free share of GPU memory, 0..1."),
        ("gpu_temperature_celsius", "gauge", "GPU temperature."),
        ("gpu_power_watts", "gauge", "GPU power draw."),
        ("host_cpu_utilization_ratio", "gauge", "Host CPU utilization, 0..1."),
        ("host_memory_used_bytes", "gauge", "Host RAM in use."),
        ("host_memory_total_bytes", "gauge", "Host RAM capacity."),
        ("disk_free_bytes", "gauge", "Free space on the run directory's disk."),
        ("disk_total_bytes", "gauge", "Size of the run directory's disk."),
        ("worker_rss_bytes", "gauge", "Resident memory of the worker process."),
        ("checkpoint_last_timestamp_seconds", "gauge", "Unix time of the latest checkpoint."),
        ("checkpoint_age_seconds", "gauge", "Seconds since the latest checkpoint was written."),
        ("checkpoints_verified", "gauge", "Checkpoints whose manifest matches their files."),
    )

    def __init__(self) -> None:
        self.by_name = {n: Family(f"steadytune_{n}", t, h) for n, t, h in self.SPEC}

    def __getitem__(self, name: str) -> Family:
        return self.by_name[name]


def active_anomalies(entry: RunEntry) -> dict[tuple[str, str], str]:
    """(kind, metric) → severity of the anomalies raised and not resolved since."""
    active: dict[tuple[str, str], str] = {}
    for kind, name, severity, metric in entry.store().anomaly_states():
        if kind == "anomaly":
            active[(name, metric)] = severity
        else:
            active.pop((name, metric), None)
    return active


def _run_families(f: _Families, entry: RunEntry, now: float) -> None:
    run = entry.run_id
    status = entry.status()
    store = entry.store()
    latest = store.latest_values()
    state = status.get("state") or "unknown"
    for s in STATES:
        f["run_state"].add(1.0 if s == state else 0.0, run=run, state=s)
    f["run_attempt"].add(status.get("attempt", latest.get("attempt")), run=run)
    step = status.get("step", latest.get("step"))
    f["step"].add(step, run=run)
    f["max_steps"].add(status.get("max_steps"), run=run)
    if step is not None and status.get("max_steps"):
        f["progress_ratio"].add(min(1.0, float(step) / float(status["max_steps"])), run=run)
    f["eta_seconds"].add(status.get("eta_s"), run=run)
    loss = math.nan if latest.get("nonfinite_latest") else latest.get("loss", status.get("loss"))
    f["loss"].add(loss, run=run)
    f["eval_loss"].add(latest.get("eval_loss"), run=run)
    f["grad_norm"].add(latest.get("grad_norm"), run=run)
    f["learning_rate"].add(latest.get("lr"), run=run)
    if latest:
        f["loss_nonfinite"].add(1.0 if latest.get("nonfinite_latest") else 0.0, run=run)
        f["nonfinite_steps_total"].add(latest.get("nonfinite_steps", 0), run=run)
        f["tokens_total"].add(latest.get("tokens_total", 0), run=run)
    f["throughput_tokens_per_second"].add(latest.get("tokens_per_s", status.get("tokens_per_s")), run=run)
    f["step_duration_seconds"].add(latest.get("step_time_s"), run=run)
    f["last_step_timestamp_seconds"].add(latest.get("ts"), run=run)
    f["status_updated_timestamp_seconds"].add(status.get("updated_ts"), run=run)
    for m in ("allocated", "reserved", "peak"):
        f[f"device_memory_{m}_bytes"].add(latest.get(f"mem_{m}_bytes"), run=run)

    for kind, severity, count in store.event_counts("anomaly"):
        f["anomalies_total"].add(count, run=run, kind=kind, severity=severity)
    active: dict[tuple[str, str], int] = {}
    for (kind, _metric), severity in active_anomalies(entry).items():
        active[(kind, severity)] = active.get((kind, severity), 0) + 1
    for (kind, severity), n in sorted(active.items()):
        f["anomalies_active"].add(n, run=run, kind=kind, severity=severity)

    reasons: dict[str, int] = {}
    for plan in store.plans():
        if plan.revision > 0 or plan.attempt > 0:
            reasons[plan.reason or "unknown"] = reasons.get(plan.reason or "unknown", 0) + 1
    counted = sum(reasons.values())
    if isinstance(status.get("restarts"), int) and status["restarts"] > counted:
        reasons["unknown"] = reasons.get("unknown", 0) + status["restarts"] - counted
    for reason, n in sorted(reasons.items()):
        f["restarts_total"].add(n, run=run, reason=reason)

    system = store.latest_system()
    if system:
        f["host_cpu_utilization_ratio"].add(system.get("cpu_ratio"), run=run)
        f["host_memory_used_bytes"].add(system.get("ram_used_bytes"), run=run)
        f["host_memory_total_bytes"].add(system.get("ram_total_bytes"), run=run)
        f["disk_free_bytes"].add(system.get("disk_free_bytes"), run=run)
        f["disk_total_bytes"].add(system.get("disk_total_bytes"), run=run)
        f["worker_rss_bytes"].add(system.get("worker_rss_bytes"), run=run)
        for g in system.get("gpus", []):
            labels = {"run": run, "gpu": str(g["idx"]), "name": g.get("name") or ""}
            f["gpu_utilization_ratio"].add(g.get("util_ratio"), **labels)
            f["gpu_memory_used_bytes"].add(g.get("mem_used_bytes"), **labels)
            f["gpu_memory_total_bytes"].add(g.get("mem_total_bytes"), **labels)
            if g.get("mem_used_bytes") is not None and g.get("mem_total_bytes"):
                f["gpu_memory_headroom_ratio"].add(1.0 - g["mem_used_bytes"] / g["mem_total_bytes"], **labels)
            f["gpu_temperature_celsius"].add(g.get("temperature_c"), **labels)
            f["gpu_power_watts"].add(g.get("power_w"), **labels)

    ckpts = entry.checkpoints()
    latest_name = ckpts["latest"] or read_pointer(entry.dir.latest_pointer)
    items = ckpts["items"]
    f["checkpoints_verified"].add(sum(1 for c in items if c["verified"]), run=run)
    newest = next((c for c in items if c["name"] == latest_name), items[-1] if items else None)
    if newest is not None and isinstance(newest.get("ts"), (int, float)):
        f["checkpoint_last_timestamp_seconds"].add(newest["ts"], run=run)
        f["checkpoint_age_seconds"].add(max(0.0, now - newest["ts"]), run=run)


def render_metrics(index: RunsIndex, now: Callable[[], float]) -> str:
    """The whole ``/metrics`` page for every run of the index."""
    import time

    t0 = time.perf_counter()
    f = _Families()
    for entry in index.entries():
        try:
            _run_families(f, entry, now())
        except Exception:  # a half-written run must not take the whole scrape down
            continue
    scrape = Family(
        "steadytune_dashboard_scrape_duration_seconds", "gauge", "Time spent rendering this page."
    )
    scrape.add(time.perf_counter() - t0)
    return render([*f.by_name.values(), scrape])

"""``/metrics``: the Prometheus exposition, by ``prometheus_client`` over the run index.

Every family is ``steadytune_*`` with a unit suffix and a ``run`` label. Values
come only from the run directory: ``status.json``, the run index, the
checkpoint pointers and the goodput account of its records (``goodput/``). A
custom collector reads them on each scrape, so there is no state to keep in
step with the runs.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from steadytune.goodput.load import AccountCache
from steadytune.goodput.parts import EVAL, LOST
from steadytune.records import grew_out_of
from steadytune.telemetry.liveness import status_live
from steadytune.web.runs import PENDING, RunEntry, RunsIndex, current_values

# A run that ended more than this long ago is left out of the per-run series (docs/prometheus.md).
KEEP_FINISHED_S = 24 * 3600.0
# steadytune_run_state is a state set (the Prometheus convention, as node_exporter's systemd unit
# state): every state below is exported for every run, 1 for its state and 0 for the rest, so
# `{state="running"} == 0` means the same for any run. A state outside the list counts as unknown.
STATES = (
    "starting", "running", "restarting", "paused", "stopping", "completed", "failed", "stopped", "unknown"
)  # fmt: skip
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
_GPU = ("run", "gpu", "name")
_KIND = ("run", "kind", "severity")

# name (without the prefix), type, help, label names.
SPEC: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "run_state",
        "gauge",
        "1 for the run's current state, 0 for every other (starting, running, ..., unknown).",
        ("run", "state"),
    ),
    ("run_attempt", "gauge", "Attempt number of the current worker (0 = first start).", ("run",)),
    ("step", "gauge", "Latest optimizer step.", ("run",)),
    ("max_steps", "gauge", "Planned number of optimizer steps.", ("run",)),
    ("progress_ratio", "gauge", "step / max_steps.", ("run",)),
    ("eta_seconds", "gauge", "Estimated time to the last step.", ("run",)),
    ("loss", "gauge", "Training loss of the latest step (NaN when it was not finite).", ("run",)),
    ("eval_loss", "gauge", "Latest evaluation loss.", ("run",)),
    ("grad_norm", "gauge", "Gradient norm of the latest step.", ("run",)),
    ("learning_rate", "gauge", "Learning rate of the latest step.", ("run",)),
    ("loss_nonfinite", "gauge", "1 when the latest step's loss or grad norm was NaN/Inf.", ("run",)),
    ("nonfinite_steps_total", "counter", "Steps whose loss or grad norm was NaN/Inf.", ("run",)),
    ("tokens_total", "counter", "Tokens trained on (latest attempt of every step).", ("run",)),
    ("throughput_tokens_per_second", "gauge", "Tokens per second of the latest step.", ("run",)),
    ("step_duration_seconds", "gauge", "Wall time of the latest step.", ("run",)),
    ("last_step_timestamp_seconds", "gauge", "Unix time of the latest step record.", ("run",)),
    (
        "status_updated_timestamp_seconds",
        "gauge",
        "Unix time the supervisor last wrote status.json.",
        ("run",),
    ),
    ("device_memory_allocated_bytes", "gauge", "Device memory allocated by the worker (rank 0).", ("run",)),
    ("device_memory_reserved_bytes", "gauge", "Device memory reserved by the allocator (rank 0).", ("run",)),
    ("device_memory_peak_bytes", "gauge", "Peak device memory of the latest step (rank 0).", ("run",)),
    ("anomalies_total", "counter", "Anomaly episodes raised, by kind and the severity raised with.", _KIND),
    ("anomalies_active", "gauge", "Anomaly episodes not yet resolved, by kind and severity now.", _KIND),
    ("restarts_total", "counter", "Worker restarts, by reason.", ("run", "reason")),
    ("gpu_utilization_ratio", "gauge", "GPU utilization, 0..1.", _GPU),
    ("gpu_memory_used_bytes", "gauge", "GPU memory in use.", _GPU),
    ("gpu_memory_total_bytes", "gauge", "GPU memory capacity.", _GPU),
    ("gpu_memory_headroom_ratio", "gauge", "Free share of GPU memory, 0..1.", _GPU),
    ("gpu_temperature_celsius", "gauge", "GPU temperature.", _GPU),
    ("gpu_power_watts", "gauge", "GPU power draw.", _GPU),
    ("host_cpu_utilization_ratio", "gauge", "Host CPU utilization, 0..1.", ("run",)),
    ("host_memory_used_bytes", "gauge", "Host RAM in use.", ("run",)),
    ("host_memory_total_bytes", "gauge", "Host RAM capacity.", ("run",)),
    ("disk_free_bytes", "gauge", "Free space on the run directory's disk.", ("run",)),
    ("disk_total_bytes", "gauge", "Size of the run directory's disk.", ("run",)),
    ("worker_rss_bytes", "gauge", "Resident memory of the worker process.", ("run",)),
    ("checkpoint_last_timestamp_seconds", "gauge", "Unix time of the latest checkpoint.", ("run",)),
    ("checkpoint_age_seconds", "gauge", "Seconds since the latest checkpoint was written.", ("run",)),
    ("checkpoints_verified", "gauge", "Checkpoints whose manifest matches their files.", ("run",)),
    (
        "goodput_ratio",
        "gauge",
        "Share of the run's wall time that became training kept in the final model (docs/goodput.md).",
        ("run",),
    ),
    (
        "wall_seconds",
        "gauge",
        "The run's wall time: from its launch (or submission) to its end, or now.",
        ("run",),
    ),
    (
        "productive_seconds_total",
        "counter",
        "Seconds of the run's wall time that became kept training.",
        ("run",),
    ),
    ("eval_seconds_total", "counter", "Seconds of the run's wall time spent evaluating.", ("run",)),
    ("lost_seconds_total", "counter", "Seconds of the run's wall time lost, by cause.", ("run", "cause")),
)


LABELS: dict[str, tuple[str, ...]] = {name: labels for name, _, _, labels in SPEC}
Sample = tuple[str, float, tuple[str, ...]]  # family, value, label values in the family's order


class Samples(list[Sample]):
    """One run's samples, kept as plain values: a finished run's are computed once (``RunEntry.memo``).

    ``add`` drops values that are missing or not numbers: a half-known run shows
    the series it has rather than none.
    """

    def add(self, family: str, value: Any, /, **labels: Any) -> None:
        if value is None:
            return
        try:
            v = float(value)
        except (TypeError, ValueError):
            return
        self.append((family, v, tuple(str(labels[k]) for k in LABELS[family])))

    @classmethod
    def load(cls, stored: Any) -> Samples:
        """The samples as JSON kept them (:mod:`.stored`): lists back to tuples."""
        return cls((str(f), float(v), tuple(str(x) for x in labels)) for f, v, labels in stored)

    def value(self, family: str) -> float | None:
        return next((v for name, v, _ in self if name == family), None)


class _Scrape:
    """The families of one scrape, created in a fixed order so the output is stable."""

    def __init__(self) -> None:
        self.families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for name, kind, help_text, labels in SPEC:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            self.families[name] = cls(f"steadytune_{name}", help_text, labels=list(labels))

    def extend(self, samples: Iterable[Sample]) -> None:
        for family, value, labels in samples:
            self.families[family].add_metric(list(labels), value)

    def __iter__(self) -> Iterator[Metric]:
        return (fam for fam in self.families.values() if fam.samples)


def state_of(status: dict[str, Any]) -> str:
    """The run's state as ``steadytune_run_state`` labels it: one of :data:`STATES`."""
    state = status.get("state")
    return state if isinstance(state, str) and state in STATES else "unknown"


def active_anomalies(entry: RunEntry) -> dict[tuple[str, str], str]:
    """(kind, metric) → severity of the anomalies raised and not resolved since."""
    active: dict[tuple[str, str], str] = {}
    for kind, name, severity, metric, grew in entry.store().anomaly_states():
        if kind == "anomaly":
            active[(name, metric)] = severity
            # The parts it grew out of are this episode now: they end with it, not on their own.
            for part in grew_out_of({"grew_out_of": _json(grew)}):
                active.pop(part, None)
        else:
            active.pop((name, metric), None)
    return active


def _json(text: str | None) -> Any:
    """A JSON value read by SQLite's json_extract, parsed; None where there is none or it is broken."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _run_samples(entry: RunEntry, accounts: AccountCache) -> Samples:
    """Every sample of one run but its checkpoint's age (which moves with the clock)."""
    f = Samples()
    run = entry.run_id
    status = entry.status()
    store = entry.store()
    latest = current_values(store.latest_values(), status)
    state = state_of(status)
    for s in STATES:
        f.add("run_state", 1.0 if s == state else 0.0, run=run, state=s)
    f.add("run_attempt", status.get("attempt", latest.get("attempt")), run=run)
    step = status.get("step", latest.get("step"))
    f.add("step", step, run=run)
    f.add("max_steps", status.get("max_steps"), run=run)
    if step is not None and status.get("max_steps"):
        f.add("progress_ratio", min(1.0, float(step) / float(status["max_steps"])), run=run)
    f.add("eta_seconds", status.get("eta_s"), run=run)
    loss = math.nan if latest.get("nonfinite_latest") else latest.get("loss", status.get("loss"))
    f.add("loss", loss, run=run)
    f.add("eval_loss", latest.get("eval_loss"), run=run)
    f.add("grad_norm", latest.get("grad_norm"), run=run)
    f.add("learning_rate", latest.get("lr"), run=run)
    if latest:
        f.add("loss_nonfinite", 1.0 if latest.get("nonfinite_latest") else 0.0, run=run)
        f.add("nonfinite_steps_total", latest.get("nonfinite_steps", 0), run=run)
        f.add("tokens_total", latest.get("tokens_total", 0), run=run)
    f.add("throughput_tokens_per_second", latest.get("tokens_per_s", status.get("tokens_per_s")), run=run)
    f.add("step_duration_seconds", latest.get("step_time_s"), run=run)
    f.add("last_step_timestamp_seconds", latest.get("ts"), run=run)
    f.add("status_updated_timestamp_seconds", status.get("updated_ts"), run=run)
    for m in ("allocated", "reserved", "peak"):
        f.add(f"device_memory_{m}_bytes", latest.get(f"mem_{m}_bytes"), run=run)

    for kind, severity, count in store.event_counts("anomaly"):
        f.add("anomalies_total", count, run=run, kind=kind, severity=severity)
    active: dict[tuple[str, str], int] = {}
    for (kind, _metric), severity in active_anomalies(entry).items():
        active[(kind, severity)] = active.get((kind, severity), 0) + 1
    for (kind, severity), n in sorted(active.items()):
        f.add("anomalies_active", n, run=run, kind=kind, severity=severity)

    reasons: dict[str, int] = {}
    for plan in store.plans():
        if plan.revision > 0 or plan.attempt > 0:
            reasons[plan.reason or "unknown"] = reasons.get(plan.reason or "unknown", 0) + 1
    counted = sum(reasons.values())
    if isinstance(status.get("restarts"), int) and status["restarts"] > counted:
        reasons["unknown"] = reasons.get("unknown", 0) + status["restarts"] - counted
    for reason, n in sorted(reasons.items()):
        f.add("restarts_total", n, run=run, reason=reason)

    system = store.latest_system()
    if system:
        f.add("host_cpu_utilization_ratio", system.get("cpu_ratio"), run=run)
        f.add("host_memory_used_bytes", system.get("ram_used_bytes"), run=run)
        f.add("host_memory_total_bytes", system.get("ram_total_bytes"), run=run)
        f.add("disk_free_bytes", system.get("disk_free_bytes"), run=run)
        f.add("disk_total_bytes", system.get("disk_total_bytes"), run=run)
        f.add("worker_rss_bytes", system.get("worker_rss_bytes"), run=run)
        for g in system.get("gpus", []):
            labels = {"run": run, "gpu": str(g["idx"]), "name": g.get("name") or ""}
            f.add("gpu_utilization_ratio", g.get("util_ratio"), **labels)
            f.add("gpu_memory_used_bytes", g.get("mem_used_bytes"), **labels)
            f.add("gpu_memory_total_bytes", g.get("mem_total_bytes"), **labels)
            if g.get("mem_used_bytes") is not None and g.get("mem_total_bytes"):
                f.add("gpu_memory_headroom_ratio", 1.0 - g["mem_used_bytes"] / g["mem_total_bytes"], **labels)
            f.add("gpu_temperature_celsius", g.get("temperature_c"), **labels)
            f.add("gpu_power_watts", g.get("power_w"), **labels)

    ckpts = entry.checkpoints()
    latest_name = ckpts["latest"]
    items = ckpts["items"]
    f.add("checkpoints_verified", sum(1 for c in items if c["verified"]), run=run)
    # The one LATEST names, else the newest whole one: a folder a save is still writing is no checkpoint.
    newest = next((c for c in items if c["name"] == latest_name), None) or next(
        (c for c in reversed(items) if c["verified"]), None
    )
    if newest is not None and isinstance(newest.get("ts"), (int, float)):
        f.add("checkpoint_last_timestamp_seconds", newest["ts"], run=run)

    # Last: a run whose records cannot be accounted for still shows every family above.
    acct = accounts.account(entry.dir)
    f.add("goodput_ratio", acct.goodput, run=run)
    f.add("wall_seconds", acct.wall_s, run=run)
    f.add("productive_seconds_total", acct.productive_s, run=run)
    f.add("eval_seconds_total", acct.seconds[EVAL], run=run)
    for cause in LOST:
        f.add("lost_seconds_total", acct.seconds[cause], run=run, cause=cause)
    return f


def run_samples(entry: RunEntry, accounts: AccountCache, wait: bool | None = None) -> Samples | None:
    """The run's samples, kept while its files stand still; None for a run not read yet that the
    caller may not wait for (``RunEntry.memo``): it is left to the background reader."""
    samples = entry.memo("metrics", lambda: _run_samples(entry, accounts), load=Samples.load, wait=wait)
    return None if samples is PENDING else samples


def _run_families(f: _Scrape, entry: RunEntry, now: float, accounts: AccountCache) -> bool:
    """Add the run's series; False if it is not read yet and was left out."""
    samples = run_samples(entry, accounts)
    if samples is None:
        return False  # all of a run's series or none: a scraper never sees a half-read run
    f.extend(samples)
    saved = samples.value("checkpoint_last_timestamp_seconds")
    if saved is not None:
        f.extend([("checkpoint_age_seconds", max(0.0, now - saved), (entry.run_id,))])
    return True


def ended_at(status: dict[str, Any]) -> float | None:
    """When a run without a live supervisor ended: its status's last update (None if unknown)."""
    ts = status.get("updated_ts")
    return float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) else None


def exported(entry: RunEntry, now: float, keep_finished_s: float) -> bool:
    """Whether ``/metrics`` carries the run's own series: a live run always; a finished one (or one
    whose supervisor is gone) for ``keep_finished_s`` after its end (``inf``: always).

    Past that, the run is only counted in ``steadytune_runs``: Prometheus keeps what it scraped
    while the run was there, and a runs folder of a thousand old runs costs a scrape nothing.
    """
    status = entry.status()
    if status_live(status, now):
        return True
    end = ended_at(status)
    return end is None or now - end <= keep_finished_s


class RunIndexCollector:
    """A ``prometheus_client`` collector that reads the runs of the index on each scrape."""

    def __init__(
        self, index: RunsIndex, now: Callable[[], float], keep_finished_s: float = KEEP_FINISHED_S
    ) -> None:
        self.index = index
        self.now = now
        self.keep_finished_s = keep_finished_s

    def collect(self) -> Iterator[Metric]:
        t0 = time.perf_counter()
        f = _Scrape()
        by_state: dict[str, int] = {}
        now = self.now()
        left_out: set[str] = set()
        for entry in self.index.entries():
            try:
                state = state_of(entry.status())
                by_state[state] = by_state.get(state, 0) + 1
                if exported(entry, now, self.keep_finished_s) and not _run_families(
                    f, entry, now, self.index.accounts
                ):
                    left_out.add(entry.run_id)
            except Exception:  # a half-written run must not take the whole scrape down
                continue
        yield from f
        runs = GaugeMetricFamily(
            "steadytune_runs",
            "Runs in the runs folder by state, those left out of the series too.",
            labels=["state"],
        )
        for state in STATES:
            runs.add_metric([state], float(by_state.get(state, 0)))
        yield runs
        pending = GaugeMetricFamily(
            "steadytune_runs_pending_index",
            "Runs found and not read yet by this dashboard: their series appear, whole, once read.",
        )
        # The runs this scrape left out count even if the background reader finished them during
        # the pass: a scrape that says none is pending must carry every run's series.
        pending.add_metric([], float(len(left_out | self.index.unread())))
        yield pending
        scrape = GaugeMetricFamily(
            "steadytune_dashboard_scrape_duration_seconds", "Time spent rendering this page."
        )
        scrape.add_metric([], time.perf_counter() - t0)
        yield scrape


def metrics_registry(
    index: RunsIndex, now: Callable[[], float], keep_finished_s: float = KEEP_FINISHED_S
) -> CollectorRegistry:
    """A registry holding only the run-index collector (no process or platform collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunIndexCollector(index, now, keep_finished_s))
    return registry


def render_metrics(
    index: RunsIndex, now: Callable[[], float], keep_finished_s: float = KEEP_FINISHED_S
) -> str:
    """The whole ``/metrics`` page: every live run, and the runs that ended within ``keep_finished_s``."""
    return generate_latest(metrics_registry(index, now, keep_finished_s)).decode("utf-8")

"""The JSON the dashboard pages read: runs, one run, its series and events.

Plain functions from a :class:`RunEntry` to JSON-safe dicts, so they are tested
without a server. Non-finite floats become ``null`` (JSON has no NaN).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from steadytune.detect.build import layer_limits
from steadytune.records import Event, PlanRevision, grew_out_of, json_safe, to_dict
from steadytune.redact import redact
from steadytune.telemetry.progress import mean_tokens_per_s
from steadytune.telemetry.store import GPU_METRICS, STEP_METRICS, SYSTEM_METRICS, Series
from steadytune.web import heatmap
from steadytune.web.runs import PENDING, RunEntry, RunsIndex, current_values

MAX_POINTS = 4000

_fast_dumps: Callable[[Any], bytes] | None
try:  # a dependency of steadytune; the standard library where it is missing
    from orjson import dumps as _fast_dumps
except ImportError:  # pragma: no cover - orjson is installed with steadytune
    _fast_dumps = None


def encode(answer: dict[str, Any]) -> bytes:
    """The JSON of a large answer of numbers and gaps (the series): orjson encodes a 1M-step run's
    charts (1 MB) in ~2.4 ms where ``json.dumps`` took 22-92 ms, the most of the answer's time.
    Its values are already cleaned (:func:`columns`); orjson would write a NaN left over as null."""
    if _fast_dumps is not None:
        return _fast_dumps(answer)
    return json.dumps(answer, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _gap(_: float) -> None:
    return None


def clean(value: Any) -> Any:
    """``value`` for the page: NaN/Inf become ``null``, a gap the charts leave undrawn (the run's
    events and the heat map say what was not finite)."""
    return json_safe(value, _gap)


def _finite(column: list[Any]) -> list[Any]:
    """A chart column with NaN/Inf as gaps: checked in one C-level pass, copied only when it has one."""
    finite = math.isfinite
    if all(map(finite, filter(None, column))):  # filter(None) drops the gaps (and zeros, finite anyway)
        return column
    return [None if type(v) is float and not finite(v) else v for v in column]


def columns(s: Series) -> dict[str, Any]:
    """A series for the page, by column: per bucket its first and last x and its count (``first``,
    ``x``, ``n``), and per metric its ``min``, ``max`` and ``mean`` per bucket.

    ``max`` and ``mean`` are left out where they equal ``min`` (raw points, a constant such as a
    device's total memory), and a metric with no value in the range is ``null``: a million-step
    run's chart was 1.4 MB of rows of 30 values, most of its time spent encoding them.
    """
    width = 3 + 3 * len(s.metrics)
    cols = [list(c) for c in zip(*s.rows, strict=True)] if s.rows else [[] for _ in range(width)]
    charted: dict[str, dict[str, list[Any]] | None] = {}
    for k, metric in enumerate(s.metrics):
        low = cols[3 + 3 * k]
        if low.count(None) == len(low):
            charted[metric] = None
            continue
        low, high, mean = _finite(low), _finite(cols[4 + 3 * k]), _finite(cols[5 + 3 * k])
        chart = {"min": low}
        if high != low:
            chart["max"] = high
        if mean != low:
            chart["mean"] = mean
        charted[metric] = chart
    return {
        "metrics": list(s.metrics), "first": cols[0], "x": cols[1], "n": cols[2], "columns": charted,
        "lo": s.lo, "hi": s.hi, "total": s.total,
        # From the 64-step / 16 s buckets even zoomed in: `steadytune compact` dropped the raw rows.
        "summarized": s.summarized,
    }  # fmt: skip


def event_dict(e: Event) -> dict[str, Any]:
    d = to_dict(e)
    d.pop("prev_hash", None)
    d.pop("hash", None)
    # Logs written before every event was redacted on its way in may still hold a secret.
    d["message"], d["data"] = redact(d.get("message", "")), redact(d.get("data") or {})
    return clean(d)


def run_summary(entry: RunEntry, wait: bool | None = None) -> dict[str, Any]:
    """One row of the runs page (a finished run's is read once, until one of its files changes).

    A run not read yet that a request may not wait for (``RunEntry.memo``) gets the row its
    ``status.json`` alone gives, marked ``"indexing": true``, its anomalies unknown (``null``).
    """
    row = entry.memo("summary", lambda: _summary(entry), load=dict, wait=wait)
    return _summary(entry, indexed=False) if row is PENDING else dict(row)


def run_tokens_per_s(status: dict[str, Any], latest: dict[str, Any]) -> float | None:
    """The run's tokens/s as its end-of-run summary gave it: the supervisor's figure in ``status.json``,
    else the same mean over the index's steps (a run imported or indexed with no supervisor); never
    the last step's alone, which the runs page showed once the run was indexed."""
    tps = status.get("tokens_per_s")
    if isinstance(tps, (int, float)) and not isinstance(tps, bool):
        return float(tps)
    return mean_tokens_per_s(latest.get("tokens_total", 0), latest.get("step_time_total", 0.0))


def _summary(entry: RunEntry, indexed: bool = True) -> dict[str, Any]:
    status = entry.status()
    store = entry.store() if indexed else None
    latest = current_values(store.latest_values(), status) if store is not None else {}
    anomalies = store.events(kinds=("anomaly",), limit=1, newest=True) if store is not None else []
    counts = store.event_counts("anomaly") if store is not None else []
    last = anomalies[-1] if anomalies else None
    row = {
        "run_id": entry.run_id,
        "state": status.get("state") or ("unknown" if not latest else "no supervisor"),
        "live": entry.supervisor_live(status),
        "step": status.get("step", latest.get("step")),
        "max_steps": status.get("max_steps"),
        "loss": latest.get("loss", status.get("loss")),
        "loss_nonfinite": bool(latest.get("nonfinite_latest")),
        "tokens_per_s": run_tokens_per_s(status, latest),
        "eta_s": status.get("eta_s"),
        "attempt": status.get("attempt", latest.get("attempt")),
        "restarts": status.get("restarts", 0),
        "last_checkpoint": status.get("last_checkpoint"),
        "anomalies": sum(n for _, _, n in counts) if store is not None else None,
        "last_anomaly": (
            {"name": last.name, "severity": last.severity, "step": last.step, "message": last.message}
            if last
            else None
        ),
        "updated_ts": status.get("updated_ts", latest.get("ts")),
        "dashboard_url": status.get("dashboard_url"),
    }
    if not indexed:
        row["indexing"] = True
    return clean(row)


def runs_list(index: RunsIndex) -> list[dict[str, Any]]:
    out = []
    for entry in index.entries():
        try:
            out.append(run_summary(entry))
        except Exception as exc:  # show a broken run as broken rather than hide the page
            out.append({"run_id": entry.run_id, "state": "unreadable", "error": type(exc).__name__})
    return out


def skip_summary(plan: PlanRevision) -> str:
    """The skip list as a person reads it: "144 samples (steps 31–48)", not a wall of sample ranges."""
    if not plan.skip_ranges:
        return ""
    n = sum(b - a + 1 for a, b in plan.skip_ranges)
    text = f"{n:,} sample{'s' if n != 1 else ''}"
    if plan.skip_steps:
        spans = ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in plan.skip_steps)
        one = len(plan.skip_steps) == 1 and plan.skip_steps[0][0] == plan.skip_steps[0][1]
        text += f" (step {spans})" if one else f" (steps {spans})"
    return text


def plans(entry: RunEntry) -> list[dict[str, Any]]:
    return [clean({**to_dict(p), "skip_summary": skip_summary(p)}) for p in entry.store().plans()]


def run_detail(entry: RunEntry, events: int = 300) -> dict[str, Any]:
    store = entry.store()
    system = store.latest_system()
    return clean(
        {
            "summary": run_summary(entry, wait=True),
            "status": entry.status(),
            "checkpoints": entry.checkpoints(),
            "plans": plans(entry),
            "events": [event_dict(e) for e in store.events(limit=events, newest=True)],
            "system": system,
            "gpus": store.gpu_indices(),
            "version": store.version,
            "last_seq": store.last_event_seq(),
            "unreadable_lines": store.unreadable_lines,
        }
    )


def _markers(events: Sequence[Event]) -> list[dict[str, Any]]:
    """One marker per episode, at its first step. An update of an episode (its severity rose) draws
    none of its own; one that grew into a graver kind (``grew_out_of``: a spike that became an
    explosion) is that episode's marker from then on, its kind and severity."""
    out: list[dict[str, Any]] = []
    for e in events:
        if e.step is None:
            continue
        marker = {"step": e.step, "name": e.name, "severity": e.severity, "message": e.message}
        parts = {kind for kind, _ in grew_out_of(e.data)}
        if parts:
            at = next((i for i, m in enumerate(out) if m["step"] == e.step and m["name"] in parts), None)
            if at is not None:
                out[at] = marker
                continue
        if not e.data.get("escalated_from"):
            out.append(marker)
    return out


def series(
    entry: RunEntry,
    points: int = 1500,
    lo: float | None = None,
    hi: float | None = None,
    gpus: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Downsampled charts of one run: steps (x = step), system and GPUs (x = unix time).

    ``gpus``: the GPUs whose charts to send (``None``: all). The run page draws one GPU; on an
    8-GPU run the seven others were two thirds of the answer. ``gpu_indices`` lists every GPU
    sampled, so a page can ask for the others when it shows them.
    """
    store = entry.store()
    points = max(10, min(int(points), MAX_POINTS))
    version = store.version
    steps = store.step_series(STEP_METRICS, points=points, lo=lo, hi=hi)
    # System charts stay whole when the step axis is zoomed: ~1 sample/s is cheap.
    system = store.system_series(SYSTEM_METRICS, points=points)
    indices = store.gpu_indices()
    shown = [i for i in indices if gpus is None or i in gpus]
    charts = {str(i): columns(store.gpu_series(i, GPU_METRICS, points)) for i in shown}
    anomalies = _markers(store.events(kinds=("anomaly",), limit=2000))
    return {
        "version": version,
        "steps": columns(steps),
        "system": columns(system),
        "gpus": charts,
        "gpu_indices": indices,
        "anomalies": anomalies,
    }


def gradflow(
    entry: RunEntry, points: int = 400, lo: float | None = None, hi: float | None = None
) -> dict[str, Any]:
    """The gradient-flow heat map of one run (layers × recorded steps), see :mod:`.heatmap`.

    Cells are judged by the run's own ``detect.grad.layer_*`` limits, as its detector judged them.
    """
    store = entry.store()
    version = store.version
    limits = layer_limits(entry.detect_config())
    points = max(1, min(int(points), heatmap.MAX_COLUMNS))
    return clean({"version": version, **heatmap.render(store.flow_map(lo, hi, points), limits)})


def gradhist(entry: RunEntry, step: int) -> dict[str, Any]:
    """The |grad| histogram of every layer at the gradient-flow recording of ``step``.

    ``hist[i][k]`` counts layer ``i``'s non-zero gradient entries with log10 magnitude in
    ``[bins[k], bins[k + 1])`` (the edge bins also hold what lies beyond); exact zeros are
    ``zero_frac``. ``step`` is ``None`` when that step has no recording with a histogram.
    """
    rows = [r for r in entry.store().gradflow(step, step, hist=True) if r.hist is not None and r.bins]
    if not rows:
        return {"step": None, "requested": step}
    r = rows[-1]
    return clean(
        {
            "step": r.step,
            "attempt": r.attempt,
            "ts": r.ts,
            "layers": list(r.layers),
            "bins": list(r.bins or ()),
            "hist": [list(h) for h in r.hist or ()],
            "zero_frac": list(r.zero_frac),
            "norm": list(r.norm),
        }
    )


def gradflow_since(entry: RunEntry, version: int) -> dict[str, Any] | None:
    """New or replaced recordings since ``version``, one column each, for the live page; None if none."""
    rows = entry.store().gradflow_since(version)
    if not rows:
        return None
    return clean(
        {
            "since": max(r.version for r in rows),
            **heatmap.build(
                sorted(rows, key=lambda r: r.step), len(rows), layer_limits(entry.detect_config())
            ),
        }
    )

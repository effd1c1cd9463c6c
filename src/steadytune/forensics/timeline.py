"""``replay``: run the detectors and the policy again over a run's recorded telemetry.

The supervisor feeds a :class:`~steadytune.detect.live.LiveDetector` and a
:class:`~steadytune.policy.engine.Policy` record by record; this module does
the same, offline, from ``telemetry/rank-*.jsonl`` and ``system.jsonl``, with
the supervisor's rules of engagement:

- every step record (eval too) goes to the detector, every system sample too;
  the policy sees each rank-0 training step and each skipped update;
- once a rollback or restart is decided, nothing is fed until the next plan
  revision (the worker is being stopped);
- at each restart (a plan revision), open anomalies are resolved as cleared and
  a fresh detector is rebuilt from the kept history up to the resume checkpoint,
  as the steps after it are trained again; an operator's resume does not rewind;
- stalls are judged at each record's timestamp (live: at each poll), so a stall
  is called when the record after the gap arrives rather than during the gap;
  loading, saving and evaluating phases are left to the setup timeout, as live.

The output is a timeline of anomalies, actions, restarts and alerts. The
anomaly/resolved part must equal what ``events.jsonl`` recorded live.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steadytune.checkpoint.manifest import checkpoint_step
from steadytune.detect.live import LiveDetector, Transition
from steadytune.records import Event, Heartbeat, PlanRevision, Record, StepRecord, SystemSample, WorkerExit
from steadytune.rundir import RunDir
from steadytune.telemetry.events import read_events
from steadytune.telemetry.progress import RunProgress
from steadytune.telemetry.stream import iter_records

_RESTARTING = {"rollback", "restart"}
_FILED = {"anomaly", "resolved", "action", "alert"}
# Anomalies the supervisor files itself, outside the detectors (facts of the run, not recomputed).
_SUPERVISOR_ANOMALIES = {"checkpoint_corrupt"}


@dataclass(frozen=True)
class Entry:
    """One line of the timeline."""

    kind: str  # anomaly / resolved / action / restart / alert
    name: str
    step: int | None
    ts: float | None = None
    severity: str = "info"
    message: str = ""
    source: str = "replay"  # replay: recomputed now; recorded: read from events.jsonl

    @property
    def key(self) -> tuple[str, str, int | None]:
        return (self.kind, self.name, self.step)


def _merged(run: RunDir) -> Iterator[Record]:
    """Every rank's records and the system samples, merged by timestamp (each file keeps its order)."""
    sources: list[Iterator[tuple[float, int, int, Record]]] = []

    def keyed(src: int, records: Iterator[Record]) -> Iterator[tuple[float, int, int, Record]]:
        for n, r in enumerate(records):
            yield (float(getattr(r, "ts", 0.0) or 0.0), src, n, r)

    for i, path in enumerate(run.telemetry_files()):
        sources.append(keyed(i, iter_records(path)))
    sources.append(keyed(len(sources), iter_records(run.system)))
    # Plan revisions mark the restarts: the supervisor rewinds detection when it writes one.
    sources.append(keyed(len(sources), (p for p in iter_records(run.plan) if isinstance(p, PlanRevision))))
    for _, _, _, rec in heapq.merge(*sources, key=lambda t: (t[0], t[1], t[2])):
        yield rec


class Replayer:
    """A torch-free stand-in for the supervisor's detection and policy loop."""

    def __init__(self, detect: Any = None, policy: Any = None) -> None:
        from steadytune.config.policy import PolicyConfig
        from steadytune.policy.engine import Policy

        self.detect_cfg = detect
        self.detector = LiveDetector(detect)
        self.policy = Policy(policy)
        self.setup_timeout_s = (policy or PolicyConfig()).setup_timeout_s
        self.progress = RunProgress(max_steps=None)
        self.entries: list[Entry] = []
        self.history: list[StepRecord] = []  # every training step record so far, as the files hold them
        self.pending: str | None = None
        self.attempt = 0
        self.last_beat: float | None = None
        self.phase, self.phase_since = "setup", 0.0

    def _transition(self, t: Transition, ts: float) -> None:
        """As the supervisor files an episode's changes (supervise/actions.py): raised and escalated
        are anomaly entries, resolved a resolved one; the policy judges each firing."""
        a = t.anomaly
        if t.state == "escalated" and not t.took:
            self.entries.append(Entry("anomaly", a.kind, a.start_step, ts, a.severity, a.metric))
        elif t.state in ("raised", "recurred") or t.took:
            for part in t.took:
                self.policy.on_resolved(part)
            if t.state != "recurred":
                self.entries.append(Entry("anomaly", a.kind, a.start_step, ts, a.severity, a.metric))
            action = self.policy.on_raised(t.fired, self.progress.step)
            if action is not None and not (t.state == "recurred" and action.name == "alert"):
                self._act(action, ts)
        else:
            self.policy.on_resolved(a)
            if t.state == "resolved":
                self.entries.append(Entry("resolved", a.kind, a.end_step, ts, "info", a.metric))

    def _act(self, action: Any, ts: float) -> None:
        name = "alert_only" if action.name == "alert" else action.name
        self.entries.append(Entry("action", name, action.step, ts, "warning", action.reason))
        if action.name in _RESTARTING and self.pending is None:
            self.pending = action.name

    def restart(self, plan: PlanRevision) -> None:
        """A new plan revision: the supervisor is about to start the next attempt.

        After a crash or an action (not after an operator's pause) it rewinds detection
        to the resume checkpoint: open anomalies are resolved as cleared, and a fresh
        detector is fed the kept history up to the resume step (latest attempt of each step).
        """
        self.pending = None
        self.attempt = max(self.attempt, plan.attempt)
        self.phase, self.phase_since, self.last_beat = "setup", plan.ts, plan.ts
        if plan.reason == "resume":
            return
        for a in self.detector.open_anomalies():
            self.entries.append(
                Entry("resolved", a.kind, a.end_step, plan.ts, "info", "cleared by the restart")
            )
        upto = (checkpoint_step(Path(plan.resume_checkpoint)) or 0) if plan.resume_checkpoint else 0
        forget = getattr(self.policy, "forget_open", None)
        if forget is not None:
            forget(upto)
        det = LiveDetector(self.detect_cfg)
        for rank in sorted({r.rank for r in self.history}):
            mine = [r for r in self.history if r.rank == rank]
            latest: dict[int, int] = {}
            for r in mine:
                if r.step <= upto:
                    latest[r.step] = max(r.attempt, latest.get(r.step, -1))
            for r in mine:
                if latest.get(r.step) == r.attempt:
                    det.observe_step(r)  # rebuilding baselines: transitions are not filed
        det.settle_episodes()  # as the supervisor does: its episodes were told, and ended or were cleared
        self.detector = det
        self.progress.rewind(upto, plan.attempt)

    def _timed_out_phase(self, ts: float) -> bool:
        return self.phase != "train" and ts - self.phase_since < self.setup_timeout_s

    def feed(self, rec: Record) -> None:
        ts = float(getattr(rec, "ts", 0.0) or 0.0)
        if isinstance(rec, PlanRevision):
            if rec.attempt > 0:
                self.restart(rec)
            return
        current = getattr(rec, "attempt", None) == self.attempt and getattr(rec, "rank", None) == 0
        if isinstance(rec, (StepRecord, Heartbeat)):
            if self.pending is None and self.last_beat is not None and not self._timed_out_phase(ts):
                for t in self.detector.observe_time(ts, self.last_beat, self.progress.step or None):
                    self._transition(t, ts)
            self.last_beat = ts
        # A step of an older attempt after the plan of a newer one: the timeline an in-process rollback
        # left, read after it was decided. The supervisor keeps it from detection too
        # (supervise/inprocess.py).
        left = isinstance(rec, StepRecord) and rec.attempt < self.attempt
        if isinstance(rec, StepRecord):
            if not left:
                self.progress.add(rec)
            if not rec.extra.get("eval"):
                self.history.append(rec)
                if current:
                    self.phase = "train"
            if self.pending is None and not left:
                for t in self.detector.observe_step(rec):
                    self._transition(t, ts)
                if rec.rank == 0 and not rec.extra.get("eval"):
                    for action in self.policy.on_step(rec.step):
                        self._act(action, ts)
        elif isinstance(rec, Heartbeat):
            if current and rec.phase != self.phase:
                self.phase, self.phase_since = rec.phase, ts
        elif isinstance(rec, SystemSample) and self.pending is None:
            for t in self.detector.observe_system(rec):
                self._transition(t, ts)
        elif isinstance(rec, Event):
            # The worker's own reports (skip_step, disk_low): facts, filed as they came.
            if rec.kind in _FILED:
                self.entries.append(
                    Entry(rec.kind, rec.name, rec.step, ts, rec.severity, rec.message, "worker")
                )
            if rec.name == "skip_step" and rec.step is not None and self.pending is None:
                escalated = self.policy.on_skipped_update(rec.step, int(rec.data.get("consecutive", 1)))
                if escalated is not None:
                    self._act(escalated, ts)
        elif isinstance(rec, WorkerExit):
            self.last_beat = None  # between attempts nobody is expected to beat


def settings(run: RunDir) -> tuple[Any, Any, list[str]]:
    """The run's detector and policy settings, and notes when some could not be used."""
    import yaml

    from steadytune.config.detect import DetectConfig
    from steadytune.config.policy import PolicyConfig
    from steadytune.config.yamlsafe import read_yaml

    try:
        raw = read_yaml(run.config) or {}
    except (OSError, yaml.YAMLError):
        return None, None, [f"{run.config} is unreadable: default detector and policy settings used"]
    out: list[Any] = []
    notes = []
    for key, model in (("detect", DetectConfig), ("policy", PolicyConfig)):
        try:
            out.append(model.model_validate(raw.get(key) or {}))
        except Exception as exc:  # a run recorded by another version of steadytune
            out.append(None)
            notes.append(
                f"the run's {key}: settings do not validate here ({str(exc).splitlines()[0]}); defaults "
                f"used, "
                "so the replay may differ from live"
            )
    return out[0], out[1], notes


def replay_run(run: RunDir) -> list[Entry]:
    """The timeline the detectors and the policy produce on the recorded telemetry, plus the
    recorded restarts and alerts (those are facts of the run, not decisions to recompute)."""
    detect, policy, _ = settings(run)
    r = Replayer(detect, policy)
    last_ts = 0.0
    for rec in _merged(run):
        r.feed(rec)
        last_ts = float(getattr(rec, "ts", 0.0) or 0.0) or last_ts
    going = {"run_started", "run_paused", "run_resumed"}  # any other run_* is the supervisor's finish
    if any(
        e.kind == "lifecycle" and e.name.startswith("run_") and e.name not in going
        for e in read_events(run.events)
    ):
        for t in r.detector.close():  # the supervisor ends its quiet episodes with the run
            r._transition(t, last_ts)
    facts = [e for e in recorded(run) if e.kind in {"restart", "alert"} or e.name in _SUPERVISOR_ANOMALIES]
    return sorted(r.entries + facts, key=lambda e: e.ts or 0.0)


def recorded(run: RunDir) -> list[Entry]:
    """The same timeline as the supervisor filed it in ``events.jsonl``."""
    out = []
    for e in read_events(run.events):
        kind: str = e.kind
        # An alert telling of a restart bears its name, yet stays an alert.
        if kind != "alert" and (
            e.name in {"restart", "rollback_in_process"}
            or (e.name == "worker_started" and int(e.data.get("attempt", 0)) > 0)
        ):
            kind = "restart"
        elif kind not in {"anomaly", "resolved", "action", "alert"}:
            continue
        out.append(Entry(kind, e.name, e.step, e.ts, e.severity, e.message, "recorded"))
    return out


def anomaly_keys(entries: list[Entry]) -> list[tuple[str, str, int | None]]:
    """The comparable core: ``(kind, name, step)`` of every anomaly and resolution, in order."""
    return [e.key for e in entries if e.kind in {"anomaly", "resolved"}]


def first_difference(a: list[Any], b: list[Any]) -> int | None:
    """Index of the first differing item of two sequences, or None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))

"""Run a recovery drill: a clean reference run, then one supervised run per fault.

Each run is a real supervised run (real worker process, real signals). The
report is computed afterwards from the run directory alone, so what it says is
what any reader of the run directory would see.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from steadytune.checkpoint.manifest import verify
from steadytune.config.load import validate_dict
from steadytune.drill.faults import DRILL_OVERRIDES, FaultSpec
from steadytune.goodput.load import run_account
from steadytune.records import Event, PlanRevision, StepRecord, from_json
from steadytune.rundir import RunDir
from steadytune.supervise.supervisor import RunResult, Supervisor
from steadytune.telemetry.events import read_events
from steadytune.telemetry.stream import iter_records


@dataclass
class FaultReport:
    kind: str
    at_step: int
    detected: bool
    detected_at_step: int | None
    action: str | None
    recovered: bool
    steps_redone: int
    recovery_seconds: float | None
    restarts: int
    final_loss: float | None  # see final_loss_is
    run_dir: str
    rolled_back_in_process: bool = False  # the rollback reloaded its checkpoint inside the running worker
    goodput: dict[str, Any] | None = None  # the run's goodput account (goodput.account.Account.to_dict)
    injected: bool = True  # the fault landed (FaultSpec.fires); False: nothing was detected or recovered from
    final_loss_is: str | None = None  # what final_loss is (FinalLoss.name)


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _steps(run: RunDir) -> list[StepRecord]:
    return [r for r in iter_records(run.telemetry(0)) if isinstance(r, StepRecord)]


# The training losses of a run's last this many steps are averaged into its final loss.
FINAL_WINDOW_STEPS = 10


@dataclass(frozen=True)
class FinalLoss:
    """The figure a drill sets a fault run's end against the clean run's, with what it is."""

    value: float
    name: str  # what the figure is, in words: "eval loss at step 120", "mean training loss of steps 31-40"


def final_loss(run: RunDir) -> FinalLoss | None:
    """The eval loss at the last evaluation (the run summary's ``eval loss``), else the mean of the
    finite training losses logged in the run's last 10 steps.

    Steps, not log lines: a job that logs every step is averaged over its last 10, which evens out
    one batch's noise; one that logs every 10 steps or less often gives its last logged loss alone,
    the last figure of the run summary's ``loss first → last``. Each step counts once, as the final
    timeline (its newest attempt) logged it.
    """
    recs = _steps(run)
    evals = [r for r in recs if r.extra.get("eval") and r.eval_loss is not None]
    if evals:
        return FinalLoss(float(evals[-1].eval_loss or 0.0), f"eval loss at step {evals[-1].step}")
    latest: dict[int, float | None] = {}
    for r in recs:
        if not r.extra.get("eval"):
            latest[r.step] = r.loss
    end = max(latest, default=0)
    tail = {
        s: x for s, x in latest.items() if s > end - FINAL_WINDOW_STEPS and x is not None and math.isfinite(x)
    }
    if not tail:
        return None
    first, last = min(tail), max(tail)
    if first == last:
        return FinalLoss(tail[last], f"training loss of step {last}")
    logged = "" if len(tail) == last - first + 1 else f", {len(tail)} logged"
    return FinalLoss(sum(tail.values()) / len(tail), f"mean training loss of steps {first}-{last}{logged}")


def finite_weights(folder: Path) -> bool:
    """Whether ``folder`` holds safetensors weights and every floating-point tensor in them is finite."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return False
    return all(
        bool(t.isfinite().all()) for f in files for t in load_file(str(f)).values() if t.is_floating_point()
    )


def weights_finite(run: RunDir) -> bool:
    """Whether a native run's final weights (``final/``) are there and finite."""
    return finite_weights(run.root / "final")


class Actor(threading.Thread):
    """Does an external fault to the worker at the right moment (kill, corrupt, kill mid-save)."""

    def __init__(self, sup: Supervisor, spec: FaultSpec) -> None:
        super().__init__(daemon=True, name=f"drill-{spec.kind}")
        self.sup, self.spec = sup, spec
        self.done_at: float | None = None
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def _step(self) -> int:
        return self.sup.state.progress.step

    def _kill(self) -> None:
        w = self.sup.state.attempt.worker
        if w is not None:
            w.signal_tree(signal.SIGKILL)
        self.done_at = time.time()

    def run(self) -> None:
        run, spec = self.sup.run, self.spec
        target = run.checkpoints / f"checkpoint-{spec.at_step}"
        while not self._stop.wait(0.01):
            if self.sup.state.attempt.number > 0:
                return
            if spec.actor == "kill" and self._step() >= spec.at_step:
                return self._kill()
            if (
                spec.actor == "kill_during_save"
                and target.is_dir()
                and not (target / "MANIFEST.json").exists()
            ):
                return self._kill()
            if (
                spec.actor == "corrupt_then_kill"
                and self._step() > spec.at_step + 2
                and verify(target, deep=False).ok
            ):
                victim = max((p for p in target.rglob("*.safetensors")), key=lambda p: p.stat().st_size)
                with open(victim, "r+b") as f:
                    f.seek(victim.stat().st_size // 2)
                    byte = f.read(1)
                    f.seek(-1, os.SEEK_CUR)
                    f.write(bytes([byte[0] ^ 0xFF]))
                return self._kill()


def run_one(
    base: dict[str, Any],
    runs_dir: Path,
    run_id: str,
    spec: FaultSpec | None,
    launch: dict[str, Any] | None = None,
) -> tuple[RunResult, float | None]:
    """One drill run; ``launch`` (run_started's, e.g. this process's start) moves its goodput's start."""
    data = deep_merge(deep_merge(base, DRILL_OVERRIDES), {"run": {"runs_dir": str(runs_dir)}})
    cfg = validate_dict(data, base=Path.cwd(), source="drill config")
    env = {"STEADYTUNE_FAULTS": json.dumps(spec.env)} if spec and spec.env else {}
    old = os.environ.pop("STEADYTUNE_FAULTS", None)
    sup = Supervisor(cfg, RunDir(runs_dir / run_id), console=None, worker_env=env, launch=launch)
    actor = Actor(sup, spec) if spec and spec.actor else None
    if actor:
        actor.start()
    try:
        result = sup.run_to_end()
    finally:
        if actor:
            actor.stop()
        if old is not None:
            os.environ["STEADYTUNE_FAULTS"] = old
    return result, actor.done_at if actor else None


def _lines(path: Path) -> list[str]:
    """The non-empty lines of a file that a run which never started may not have written."""
    return [ln for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _first(
    events: list[Event], names: tuple[str, ...], after_ts: float, kinds: tuple[str, ...]
) -> Event | None:
    return next((e for e in events if e.name in names and e.kind in kinds and e.ts >= after_ts), None)


def report(spec: FaultSpec, result: RunResult, external_ts: float | None) -> FaultReport:
    """What happened to one fault of a native run, read back from the run directory."""
    return report_run(spec, result.run, result.state, external_ts, weights_finite(result.run))


def report_run(
    spec: FaultSpec, run: RunDir, state: str, external_ts: float | None, weights_ok: bool
) -> FaultReport:
    """What happened to one fault, read back from the run directory alone.

    Any supervisor that writes a run directory can be reported on: ``state`` is how the run
    ended, ``external_ts`` when an outside actor did the fault (None: the fault shows in the
    telemetry at ``spec.at_step``), ``weights_ok`` whether what the run left is usable.
    """
    events = read_events(run.events)
    recs = _steps(run)
    plans = [p for p in (from_json(line) for line in _lines(run.plan)) if isinstance(p, PlanRevision)]
    reached = next(
        (r for r in recs if r.step >= spec.at_step - 1 and r.attempt == 0 and not r.extra.get("eval")), None
    )
    inject_ts = external_ts if external_ts is not None else (reached.ts if reached else 0.0)
    detection = _first(events, spec.detect, inject_ts - 1.0, ("anomaly", "action", "lifecycle"))
    action = _first(events, spec.act, inject_ts - 1.0, spec.act_kinds)
    # Steps redone: for each restart, how far the previous attempt got past the checkpoint it resumed from.
    redone = 0
    recovery: float | None = None
    starts: dict[int, PlanRevision] = {}
    for plan in plans:  # the first revision of each attempt is the one it started with
        starts.setdefault(plan.attempt, plan)
    for attempt, plan in sorted(starts.items()):
        if attempt == 0:
            continue
        prev_max = max(
            (r.step for r in recs if r.attempt == plan.attempt - 1 and not r.extra.get("eval")), default=0
        )
        resumed = int(Path(plan.resume_checkpoint).name.split("-")[1]) if plan.resume_checkpoint else 0
        redone += max(0, prev_max - resumed)
        first_new = next((r.ts for r in recs if r.attempt == plan.attempt and not r.extra.get("eval")), None)
        started = external_ts or (action.ts if action else plan.ts)
        if recovery is None and first_new is not None:
            recovery = first_new - started
    if spec.in_process and detection is not None:
        after = next((r.ts for r in recs if r.step > (detection.step or 0) and not r.extra.get("eval")), None)
        recovery = (after - detection.ts) if after else None
    if spec.expect_state != "completed" and action is not None:
        recovery = action.ts - inject_ts  # the answer is the action itself (a clean stop): how long it took
    restarts = max((p.attempt for p in plans), default=0)
    # A stopped run's loss is where it stopped, not an end to set against the clean run's.
    end = final_loss(run) if spec.expect_state == "completed" else None
    # Whether the fault landed: an actor's says so itself; a worker's that files an event, by it; else,
    # by the first attempt reaching the fault's step (a run that ended first had nothing done to it).
    if spec.actor:
        injected = external_ts is not None
    elif spec.fires:
        injected = any(e.name in spec.fires for e in events)
    else:
        injected = reached is not None
    recovered = injected and state == spec.expect_state and weights_ok
    return FaultReport(
        kind=spec.kind,
        at_step=spec.at_step,
        detected=detection is not None,
        detected_at_step=detection.step if detection else None,
        action=action.name if action else None,
        recovered=recovered,
        steps_redone=redone,
        recovery_seconds=round(recovery, 2) if recovery is not None else None,
        restarts=restarts,
        final_loss=end.value if end else None,
        run_dir=str(run.root),
        rolled_back_in_process=any(e.name == "rolled_back" for e in events),
        goodput=run_account(run).to_dict(),
        injected=injected,
        final_loss_is=end.name if end else None,
    )


def as_dict(r: FaultReport) -> dict[str, Any]:
    return asdict(r)

"""The drill for a command steadytune does not run: ``steadytune drill --supervise -- CMD``.

Each fault run is ``steadytune supervise -- CMD`` in a subprocess, a black box: the
faults are done from outside to the real processes (a signal, a cut file), at the
moment the run directory shows, and the report is read back from the run directory
and the job's output folder alone, as for the native drill.

With ``inject`` each run is ``steadytune supervise --inject``: the tool's own HF Trainer
carries the guard, which honours ``$STEADYTUNE_FAULTS`` as a native worker does, so the
faults that need a hook inside the job (``nan``, ``spike``) are done from there, with the
native drill's own fault specs. An injected OOM is not among them: the guard does not
split the tool's micro-batch (see :data:`INJECTED_OOM`).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from steadytune.checkpoint.external import check_external_checkpoint
from steadytune.checkpoint.manifest import list_checkpoints
from steadytune.drill.command import SuperviseLine, filled, supervise_argv, with_output_dir
from steadytune.drill.faults import FaultSpec
from steadytune.drill.faults import catalogue as native_catalogue
from steadytune.drill.runner import FaultReport, finite_weights, report_run
from steadytune.records import run_end
from steadytune.rundir import RunDir
from steadytune.supervise.process import running
from steadytune.telemetry.events import read_events
from steadytune.telemetry.jsonl import JsonlReader

# The lr fault starts the job at this many times its own LR (as the native spike bursts it);
# the drill's rollback scale undoes exactly that, so the rolled-back run trains at the job's LR.
LR_FAULT_FACTOR = 1000.0
DEFAULT_FAULTS = "kill,truncated,hang,lr,sigterm"
# With --inject, the native faults the injected guard does from inside the trainer.
INSIDE_FAULTS = ("nan", "spike")
INJECT_FAULTS = "nan,spike," + DEFAULT_FAULTS
# Why ``oom`` is not drilled with --inject: what the injected guard does with one instead.
INJECTED_OOM = (
    "the injected guard does not split the tool's micro-batch (its batch shape is its own): an OOM "
    "ends the job, supervise restarts it from its newest checkpoint as it was, and a real shortage "
    "fails again at the same step, where supervise stops rather than loop; lower the command's "
    "per_device_train_batch_size, or drill oom with `steadytune drill` (native)"
)


def catalogue(save_steps: int, inject: bool = False) -> dict[str, FaultSpec]:
    """The faults of a supervised drill, placed relative to the job's checkpoint interval.

    Without ``inject``, those done from outside; with it, also the native drill's ``nan``
    and ``spike``, which the injected guard does inside the trainer.
    """
    s = save_steps
    inside = native_catalogue(s) if inject else {}
    return {
        **{k: inside[k] for k in INSIDE_FAULTS if k in inside},
        "kill": FaultSpec("kill", 2 * s + s // 2, actor="kill", detect=("restart",), act=("restart",)),
        # The newest checkpoint's weights are cut short, then the trainer is killed: the resume
        # must skip it for the one before.
        "truncated": FaultSpec(
            "truncated", 2 * s, actor="truncate_then_kill", detect=("checkpoint_corrupt",), act=("restart",)
        ),
        "hang": FaultSpec("hang", 2 * s + s // 2, actor="stop", detect=("stall",), act=("restart",)),
        "lr": FaultSpec(
            "lr",
            1,
            detect=("loss_spike", "divergence", "grad_explosion", "grad_spike", "nan_loss"),
            act=("rollback",),
        ),
        "sigterm": FaultSpec(
            "sigterm",
            2 * s + s // 2,
            actor="sigterm",
            detect=("stop_requested",),
            act=("run_stopped",),
            act_kinds=("lifecycle",),
            expect_state="stopped",
        ),
    }


def drill_overrides() -> dict[str, object]:
    """The drill's policy over the user's: no paging, spikes confirmed fast."""
    return {"policy.spike_confirm_points": 2, "alerts.enabled": False}


def fault_overrides(spec: FaultSpec | None) -> tuple[str, ...]:
    """``--set`` items for one fault's run: the lr fault's rollback undoes exactly its 1000x.

    Only that run: a ``spike`` rollback lowers the job's own LR by the policy's scale.
    """
    if spec is not None and spec.kind == "lr":
        return (f"policy.rollback_lr_scale={1.0 / LR_FAULT_FACTOR!r}",)
    return ()


def fault_env(spec: FaultSpec | None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one fault's ``steadytune supervise``: the drill's own, with ``$STEADYTUNE_FAULTS``
    set to the fault's (an injected guard honours it), or removed (a clean or an outside fault)."""
    env = dict(os.environ if environ is None else environ)
    env.pop("STEADYTUNE_FAULTS", None)
    if spec is not None and spec.env:
        env["STEADYTUNE_FAULTS"] = json.dumps(spec.env)
    return env


@dataclass(frozen=True)
class Job:
    """The command under drill and how ``steadytune supervise`` is to run it."""

    command: tuple[str, ...]  # with {output_dir} or an --output_dir value the drill replaces
    line: SuperviseLine
    base_lr: float | None = None  # the job's own LR (the lr fault needs it)
    timeout_s: float = 900.0  # a fault run still going after this is stopped and counts as failed


@dataclass
class Outcome:
    """How one supervised drill run ended, as seen from outside."""

    run: RunDir
    output_dir: Path
    state: str  # status.json's final state; "timeout" or "not started" when it has none
    returncode: int | None
    fault_ts: float | None  # when the outside actor did the fault
    note: str = ""  # what the actor did, in words
    cut: str | None = None  # the checkpoint whose weights the actor cut short
    left_running: list[int] = field(default_factory=list)  # pids of the job still alive after supervise
    console: Path | None = None
    inject: bool = False  # the job's trainer carried the guard (supervise --inject)
    line: SuperviseLine | None = None  # how supervise restarted it (its LR argument)
    base_lr: float | None = None  # the first attempt's LR, which a rollback scales


def trainer_pid(root: int) -> int:
    """The trainer of a job's process tree: its deepest Python process (a launcher's child), else the root.

    ``python train.py`` is its own trainer; ``trl sft`` or ``accelerate launch`` start one as a child.
    """
    try:
        proc = psutil.Process(root)
        tree = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return root
    best, best_depth = root, -1
    for p in tree:
        try:
            if "python" not in p.name().lower():
                continue
            depth = 0
            q: psutil.Process | None = p
            while q is not None and q.pid != root:
                q, depth = q.parent(), depth + 1
        except psutil.Error:
            continue
        if depth > best_depth:
            best, best_depth = p.pid, depth
    return best


class Watch:
    """What a supervised run's directory says so far: the first attempt's pid and step, incrementally."""

    def __init__(self, run: RunDir) -> None:
        self._events = JsonlReader(run.events)
        self._steps = JsonlReader(run.telemetry(0))
        self.worker_pids: list[int] = []  # one per attempt, from its worker_started event
        self.step = 0  # the newest training step of the first attempt

    def poll(self) -> None:
        for e in self._events.dicts():
            if e.get("name") == "worker_started" and isinstance((e.get("data") or {}).get("pid"), int):
                self.worker_pids.append(e["data"]["pid"])
        for r in self._steps.dicts():
            extra = r.get("extra") or {}
            if r.get("type") == "step" and r.get("attempt") == 0 and not extra.get("eval"):
                self.step = max(self.step, int(r.get("step") or 0))

    @property
    def first_attempt(self) -> bool:
        return len(self.worker_pids) == 1


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def truncate_newest(output_dir: Path) -> tuple[str, str]:
    """Cut the newest checkpoint's largest weights file to half its length, as a full disk would.

    Returns the checkpoint's name and what was done, in words.
    """
    newest = list_checkpoints(output_dir)[0]
    weights = list(newest.glob("*.safetensors")) or [p for p in newest.rglob("*") if p.is_file()]
    victim = max(weights, key=lambda p: p.stat().st_size)
    size = victim.stat().st_size
    os.truncate(victim, size // 2)
    return newest.name, f"cut {newest.name}/{victim.name} from {size} to {size // 2} bytes"


class Actor(threading.Thread):
    """Does one fault to the first attempt of a supervised run, at its step, from outside."""

    def __init__(self, spec: FaultSpec, run: RunDir, output_dir: Path, supervisor: subprocess.Popen) -> None:
        super().__init__(daemon=True, name=f"drill-{spec.kind}")
        self.spec, self.output_dir, self.supervisor = spec, output_dir, supervisor
        self.watch = Watch(run)
        self.done_at: float | None = None
        self.note = ""
        self.cut: str | None = None
        self.trainers: list[int] = []
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def _due(self) -> bool:
        spec, step = self.spec, self.watch.step
        if spec.actor == "truncate_then_kill":
            # The checkpoint at the fault's step is whole and the trainer has gone past it.
            ckpt = self.output_dir / f"checkpoint-{spec.at_step}"
            return step >= spec.at_step + 2 and check_external_checkpoint(ckpt)[0]
        return step >= spec.at_step

    def run(self) -> None:
        while not self._halt.wait(0.05):
            self.watch.poll()
            if len(self.watch.worker_pids) > 1 or self.supervisor.poll() is not None:
                return  # the first attempt ended before the fault's step: nothing was done
            if not self.watch.first_attempt or not self._due():
                continue
            self._act()
            self.done_at = time.time()
            return

    def _act(self) -> None:
        actor = self.spec.actor
        if actor == "sigterm":
            self.supervisor.send_signal(signal.SIGTERM)
            self.note = f"SIGTERM to steadytune supervise (pid {self.supervisor.pid})"
            return
        pid = trainer_pid(self.watch.worker_pids[0])
        self.trainers.append(pid)
        if actor == "stop":
            _signal(pid, signal.SIGSTOP)
            self.note = f"SIGSTOP to the trainer (pid {pid})"
        elif actor == "kill":
            _signal(pid, signal.SIGKILL)
            self.note = f"SIGKILL to the trainer (pid {pid})"
        elif actor == "truncate_then_kill":
            _signal(pid, signal.SIGSTOP)  # frozen, it cannot start the next save while its newest is cut
            self.cut, what = truncate_newest(self.output_dir)
            self.note = f"{what}, then SIGKILL to the trainer (pid {pid})"
            _signal(pid, signal.SIGKILL)


def _end(proc: subprocess.Popen, grace_s: float = 60.0) -> int | None:
    """Stop a supervise that ran past its time as a user would: SIGTERM (it stops the job), then SIGKILL."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def run_one(job: Job, runs_dir: Path, run_id: str, spec: FaultSpec | None) -> Outcome:
    """One ``steadytune supervise`` run of the job, with ``spec`` done to it from outside (None: clean)."""
    out = runs_dir / "outputs" / run_id
    command = with_output_dir(job.command, out)
    base_lr = job.base_lr
    if spec is not None and spec.kind == "lr":
        assert job.base_lr is not None, "the lr fault needs the job's LR"
        base_lr = job.base_lr * LR_FAULT_FACTOR
        command += filled(job.line.lr_arg, lr=f"{base_lr:g}")  # the first attempt's LR; a rollback lowers it
    line = replace(job.line, overrides=job.line.overrides + fault_overrides(spec))
    argv = supervise_argv(line, command, out, runs_dir, run_id, base_lr)
    run = RunDir(runs_dir / run_id)
    console = runs_dir / f"{run_id}.console.txt"
    with open(console, "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=fault_env(spec)
        )
    actor = Actor(spec, run, out, proc) if spec is not None and spec.actor else None
    if actor:
        actor.start()
    try:
        rc: int | None = proc.wait(job.timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        rc, timed_out = _end(proc), True
    finally:
        if actor:
            actor.stop()
            actor.join(5)
    watch = Watch(run)
    watch.poll()
    # Whatever of the job outlived its supervisor is reported, then ended: the next fault needs the cores.
    left = running([*watch.worker_pids, *(actor.trainers if actor else [])])
    for pid in left:
        _signal(pid, signal.SIGKILL)
    return Outcome(
        run=run,
        output_dir=out,
        state="timeout" if timed_out else _final_state(run),
        returncode=rc,
        fault_ts=actor.done_at if actor else None,
        note=actor.note if actor else "",
        cut=actor.cut if actor else None,
        left_running=left,
        console=console,
        inject=job.line.inject,
        line=line,
        base_lr=base_lr,
    )


def _final_state(run: RunDir) -> str:
    try:
        return str(json.loads(run.status.read_text()).get("state"))
    except (OSError, ValueError):
        return "not started"


def final_weights(output_dir: Path) -> Path:
    """Where a job's last weights are: the output folder when it saved a model there, else its newest
    checkpoint."""
    if any(output_dir.glob("*.safetensors")):
        return output_dir
    found = list_checkpoints(output_dir)
    return found[0] if found else output_dir


def usable(spec: FaultSpec | None, outcome: Outcome) -> bool:
    """Whether the run ended as recovery requires, beyond its end state (which the report checks)."""
    if outcome.left_running:
        return False  # a supervisor that leaves the job running has not handled anything
    if spec is not None and spec.actor and outcome.fault_ts is None:
        return False  # the fault never happened: nothing was proven
    if spec is not None and spec.expect_state == "stopped":
        # An injected trainer gets a stop request and checkpoints the step it is on.
        saved = not outcome.inject or checkpointed_at_stop(outcome.run)
        return outcome.returncode == 128 + signal.SIGTERM and saved
    if (
        spec is not None
        and spec.in_process
        and max((p.get("attempt", 0) for p in _plans(outcome.run)), default=0)
    ):
        return False  # handled inside the trainer: a restart means it was not
    if spec is not None and spec.kind == "spike" and not lr_lowered(spec, outcome):
        return False  # the rollback must reach the job's LR, or it would spike again
    if spec is not None and spec.kind == "truncated":
        resumed = [p for p in _plans(outcome.run) if p.get("attempt") == 1]
        if not resumed or Path(str(resumed[0].get("resume_checkpoint"))).name == outcome.cut:
            return False  # the cut checkpoint was resumed, or nothing was
    return finite_weights(final_weights(outcome.output_dir))


def _events(run: RunDir) -> list[dict]:
    return JsonlReader(run.events).read_dicts() if run.events.exists() else []


def checkpointed_at_stop(run: RunDir) -> bool:
    """Whether the job saved a checkpoint at the step the run stopped on."""
    events = read_events(run.events) if run.events.exists() else []
    end = run_end(events)
    return (
        end is not None
        and end.name == "run_stopped"
        and end.step is not None
        and any(e.name == "checkpoint_saved" and e.step == end.step for e in events)
    )


def lr_lowered(spec: FaultSpec, outcome: Outcome) -> bool:
    """Whether the last attempt trained at the rollback's lower LR, given through the job's LR argument.

    Two things must hold: supervise appended the LR argument filled with the first LR times the
    scale of the plan the attempt started with; and, where the guard records the optimizer's LR
    (``--inject``), each step it trained again ran at that scale of the first attempt's LR on the
    same step, with the fault's own burst taken out: a tool that restores its scheduler from the
    checkpoint would otherwise keep the old rate, whatever its command line says.
    """
    starts: dict[int, dict] = {}
    for plan in _plans(outcome.run):
        starts.setdefault(int(plan.get("attempt") or 0), plan)
    last = max(starts, default=0)
    scale = starts.get(last, {}).get("lr_scale")
    if outcome.line is None or outcome.base_lr is None or not last or not scale or scale >= 1:
        return False
    base = float(f"{outcome.base_lr:g}")  # as the drill gave it to supervise (--base-lr)
    words = filled(outcome.line.lr_arg, lr=f"{base * scale:.6g}")
    started = [e["data"].get("cmd") or [] for e in _events(outcome.run) if e.get("name") == "worker_started"]
    if len(started) < 2 or list(started[-1][-len(words) :]) != words:
        return False
    if not outcome.inject:
        return True  # the log adapter sees no optimizer: the command line is all there is to check
    burst = spec.env.get("lr_burst_factor", 1.0)
    first = spec.env.get("lr_burst_at_step", 0)
    in_burst = range(first, first + spec.env.get("lr_burst_steps", 0))
    lrs: dict[int, dict[int, float]] = {0: {}, last: {}}
    for r in JsonlReader(outcome.run.telemetry(0)).dicts():
        attempt, lr = r.get("attempt"), r.get("lr")
        if (
            r.get("type") == "step"
            and attempt in lrs
            and isinstance(lr, (int, float))
            and not (r.get("extra") or {}).get("eval")
        ):
            lrs[attempt][int(r["step"])] = float(lr) / (
                burst if attempt == 0 and r["step"] in in_burst else 1.0
            )
    both = sorted(set(lrs[0]) & set(lrs[last]))
    return bool(both) and all(math.isclose(lrs[last][k], scale * lrs[0][k], rel_tol=1e-3) for k in both)


def clean_run_problem(run: RunDir, hang_floor_s: float) -> str | None:
    """Why a clean run that completed is no reference for the faults: it restarted on its own.

    A fault's recovery is read from the restarts and anomalies of its run; where the job restarts
    without one, they could not be told apart, and a fault placed past the first restart never
    meets its first attempt. A stall is the usual cause: the drill's short hang floor against a
    job that shows a step only every ``logging_steps``. None when the clean run did not restart.
    """
    starts: dict[int, dict] = {}
    for plan in _plans(run):
        starts.setdefault(int(plan.get("attempt") or 0), plan)
    why = [str(p.get("notes") or p.get("reason")).split(";")[0] for a, p in sorted(starts.items()) if a]
    if not why:
        return None
    hint = ""
    if any(str(starts[a].get("reason")) == "stall" for a in starts if a):
        hint = (
            f" A stall in a clean run is the job's pace, not a hang: it showed no step for --hang-floor "
            f"{hang_floor_s:g} s (a job that logs every N steps shows one each N steps); give --hang-floor "
            "above the longest gap between its logged steps."
        )
    return (
        f"the clean run of the command restarted {len(why)} time(s) on its own ({'; '.join(why)}), so no "
        f"fault was run: a fault's recovery could not be told from those.{hint}"
    )


def _plans(run: RunDir) -> list[dict]:
    return JsonlReader(run.plan).read_dicts() if run.plan.exists() else []


def report(spec: FaultSpec, outcome: Outcome) -> FaultReport:
    """The native drill's report of one fault, from the run directory and the job's output folder."""
    return report_run(spec, outcome.run, outcome.state, outcome.fault_ts, usable(spec, outcome))

"""Several faults, one after another, in one supervised run of a tool; and the row each fault earns.

A tool's start costs tens of seconds on a small machine (its imports, its data, the model),
so the faults that each end in a restart share one run: each waits for a checkpoint the
attempt it hits has written, then strikes; the supervisor's restart starts the next
attempt, and the next fault waits for that one's checkpoint. What each fault led to is
read back from the run directory attempt by attempt (:func:`rows`), so every row is
judged on its own although the run is shared.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from steadytune.checkpoint.external import check_external_checkpoint
from steadytune.records import Event

from .runs import wait_for
from .toolruns import Supervised, ToolJob, all_finite

KILL_TRAINER = "SIGKILL trainer"
KILL_LAUNCHER = "SIGKILL launcher"
TRUNCATE = "truncated newest checkpoint + SIGKILL"
HANG = "SIGSTOP trainer (hang)"


@dataclass
class Fault:
    """One fault as it was made: what, into which attempt, when, and the state of the checkpoints."""

    name: str
    attempt: int
    at: float  # wall time it struck
    whole: int  # the newest whole checkpoint's step just after it struck (0: none)
    cut: int | None = None  # the checkpoint it cut short
    pids: list[int] = field(default_factory=list)  # the processes it struck
    tree: list[int] = field(default_factory=list)  # the attempt's whole tree when it struck
    trainers: list[int] = field(default_factory=list)  # its training processes then
    state: dict = field(default_factory=dict)  # the trainer_state.json of the checkpoint it waited for


@dataclass
class Row:
    """What one fault led to, as docs/recovery.md tabulates it."""

    tool: str
    fault: str
    inject: bool
    run: str  # the shared run it belongs to
    detected_as: str | None
    action: str | None
    resumed_from: int | None
    steps_redone: int | None
    recover_s: float | None
    end_state: str | None
    weights_finite: bool | None

    def printed(self) -> str:
        """Printed (``pytest -s``), and appended to ``$STEADYTUNE_FAULT_ROWS`` where set: the output of a
        test on an xdist worker does not reach the terminal."""
        line = "FAULT-ROW " + json.dumps(asdict(self))
        print(line)
        rows = os.environ.get("STEADYTUNE_FAULT_ROWS")
        if rows:
            with open(rows, "a") as f:
                f.write(line + "\n")
        return line


def newest_whole(job: ToolJob) -> int:
    return max((s for s in job.checkpoints() if check_external_checkpoint(job.checkpoint(s))[0]), default=0)


def _tree(sup: Supervised) -> list[psutil.Process]:
    try:
        root = psutil.Process(sup.worker())
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def wait_new_checkpoint(sup: Supervised, job: ToolJob, above: int, timeout: float = 600) -> int:
    """The step of a whole checkpoint past ``above`` (and its trainer_state.json: written last but one)."""

    def found() -> int | None:
        sup.alive()
        for s in reversed(job.checkpoints()):
            ck = job.checkpoint(s)
            if s > above and (ck / "trainer_state.json").exists() and check_external_checkpoint(ck)[0]:
                return s
        return None

    step = wait_for(found, timeout=timeout, what=f"a checkpoint past step {above}")
    sup.note()
    return step


def strike(sup: Supervised, job: ToolJob, name: str, attempt: int) -> Fault:
    """Make fault ``name`` in the running attempt ``attempt``, once it has saved a checkpoint of its own."""
    floor = max(job.checkpoints(), default=0)
    saved = wait_new_checkpoint(sup, job, floor)
    # Read now: a tool that keeps a few checkpoints deletes it later.
    state = json.loads((job.checkpoint(saved) / "trainer_state.json").read_text())
    trainers = wait_for(lambda: sup.alive() and job.trainers(sup.worker()), timeout=120, what="the trainers")
    tree = _tree(sup)
    sup.note()
    launcher = sup.worker()
    cut = None
    if name == KILL_TRAINER:
        struck = [trainers[-1].pid]  # accelerate: the last rank; the others are left to the launcher
        os.kill(struck[0], signal.SIGKILL)
    elif name == KILL_LAUNCHER:
        struck = [launcher]
        os.kill(launcher, signal.SIGKILL)
    elif name == TRUNCATE:
        # Freeze the whole tree (torch's launcher starts its ranks in sessions of their own), so the
        # newest checkpoint is the one cut, then kill it.
        for p in tree:
            _signal(p.pid, signal.SIGSTOP)
        cut = max(job.checkpoints())
        weights = job.checkpoint(cut) / job.weights_file
        weights.write_bytes(weights.read_bytes()[:-100])  # the header intact, the file cut short
        struck = [p.pid for p in tree]
        for pid in struck:
            _signal(pid, signal.SIGKILL)
    elif name == HANG:
        # Once it trains again: a trainer stopped inside a save is judged by the setup timeout (a save
        # may hold the GIL for minutes), not by the hang floor.
        wait_for(
            lambda: sup.alive() and any(r.step > saved and r.attempt == attempt for r in sup.steps()),
            timeout=300,
            what=f"a step after checkpoint-{saved}",
        )
        struck = [trainers[0].pid]
        os.kill(struck[0], signal.SIGSTOP)
    else:
        raise ValueError(f"unknown fault {name!r}")
    at = time.time()
    return Fault(name, attempt, at, newest_whole(job), cut, struck, [p.pid for p in tree],
                 trainers=[p.pid for p in trainers], state=state)  # fmt: skip


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def wait_started(sup: Supervised, attempts: int, timeout: float = 300) -> None:
    """Until ``attempts`` workers have been started in all."""
    wait_for(
        lambda: sup.alive() and len(sup.named("worker_started")) >= attempts,
        timeout=timeout,
        what=f"worker start {attempts}",
    )


def chain(sup: Supervised, job: ToolJob, faults: list[str]) -> list[Fault]:
    """Each fault in turn, each in the attempt the one before led to."""
    made = []
    for attempt, name in enumerate(faults):
        made.append(strike(sup, job, name, attempt))
        wait_started(sup, attempt + 2)
    return made


def plan(sup: Supervised) -> list[dict]:
    return [json.loads(line) for line in (sup.run / "plan.jsonl").read_text().splitlines()]


def step_of(checkpoint: str | None) -> int:
    return int(Path(checkpoint).name.split("-")[1]) if checkpoint else 0


def restart_events(events: list[Event]) -> list[Event]:
    """The restart of each attempt that ended, in order: an action's own ``restart`` event (the policy
    asking for one) goes before it and carries no classification."""
    return [e for e in events if e.name == "restart" and "classification" in e.data]


def row(sup: Supervised, fault: Fault, inject: bool, run: str, weights: Path | None = None) -> Row:
    """The row of a fault that ended attempt ``fault.attempt``: the restart after it, from the run directory.

    Detected as: the restart's classification (the exit's cause, or the anomaly that asked for it).
    Steps redone: the last step the struck attempt recorded, less the step the next one resumed from.
    Seconds to recover: from the fault to the next attempt's first recorded step.
    """
    events = sup.events()
    restarts = restart_events(events)
    restart = restarts[fault.attempt] if fault.attempt < len(restarts) else None
    before = restarts[fault.attempt - 1].seq if 0 < fault.attempt <= len(restarts) else -1
    rolled = restart is not None and any(
        e.name == "rollback" and before < e.seq < restart.seq for e in events
    )
    nxt = [r for r in plan(sup) if r.get("attempt") == fault.attempt + 1]
    resumed = step_of(nxt[0].get("resume_checkpoint")) if restart and nxt else None
    recs = sup.steps()
    struck = [r.step for r in recs if r.attempt == fault.attempt]
    after = [r for r in recs if r.attempt == fault.attempt + 1]
    weights = weights if weights is not None else job_weights(sup)
    return Row(
        tool=sup.job.tool,
        fault=fault.name,
        inject=inject,
        run=run,
        detected_as=restart.data.get("classification") if restart else None,
        action=("rollback" if rolled else "restart") if restart else None,
        resumed_from=resumed,
        steps_redone=(max(struck) - resumed) if struck and resumed is not None else None,
        recover_s=round(after[0].ts - fault.at, 1) if after else None,
        end_state=sup.status().get("state"),
        weights_finite=all_finite(weights) if weights.exists() else None,
    )


def job_weights(sup: Supervised) -> Path:
    """The weights the run ended with: the output folder's own, else its newest checkpoint's."""
    job = sup.job
    final = job.out / job.weights_file
    if final.exists() or not job.checkpoints():
        return final
    return job.checkpoint(max(job.checkpoints())) / job.weights_file

"""Where a supervised run's worker comes from: the one thing that differs between ``run`` and ``supervise``.

The :class:`~steadytune.supervise.supervisor.Supervisor` does everything else once:
detectors, system sampling, policy and budgets, alerts, ``run.db``, status, events,
plan revisions, stack dumps, operator controls, restarts. A source starts an
attempt for a plan, makes its progress appear as records in ``telemetry/rank-N.jsonl``
and says which checkpoints it could resume from. What a source can do is a set of
*abilities*; the supervisor asks for an action only where the source has the
ability for it, and says so when it has not.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from steadytune.checkpoint.manifest import list_checkpoints, verify
from steadytune.checkpoint.store import clean_staging, read_pointer
from steadytune.records import PlanRevision, Record
from steadytune.rundir import RunDir
from steadytune.supervise.process import ProcessTree, WorkerProcess, worker_command
from steadytune.supervise.standby import Standby
from steadytune.telemetry.segments import SEGMENT_ENV

if TYPE_CHECKING:
    from steadytune.config.schema import RayConfig, SteadytuneConfig

# Abilities a source may have.
PLAN = "plan"  # the worker reads the whole plan: batch shape, micro-batch split, skip list, OOM changes
CONTROL = "control"  # it answers control requests (checkpoint now, pause, stop) in-process
SKIP_STEP = "skip_step"  # a non-finite update is skipped before it reaches the weights
LR = "lr"  # a rollback's lower learning rate reaches the optimizer
DATA = "data"  # the supervisor knows the data, so it can inspect a bad step's batch
RELOAD = "reload"  # a rollback can reload the checkpoint inside the running worker (train/rollback.py)
REQUEST = (
    "request"  # the engine sizes the job itself: a resize is a resource request to it (Ray), not a relaunch
)


class SizesItself(Protocol):
    """A source with ``REQUEST``: the engine sizes the job, and a resize is a request to it."""

    def request_workers(self, kind: str, workers: int, reason: str, ts: float, cfg: RayConfig) -> Path | None:
        """Ask the engine for ``workers`` workers; where the request went, or None when no attempt runs."""
        ...


class WorkerSource(Protocol):
    """Starts attempts of one run and tells the supervisor what it can resume from."""

    label: str  # "worker" (steadytune's own) or "job" (a command it watches)
    abilities: frozenset[str]
    checkpoint_root: Path | None  # where its checkpoint-N folders are

    def start(self, plan: PlanRevision, log_path: Path) -> WorkerProcess:
        """Start the attempt ``plan`` describes (resume point, LR scale, shape)."""
        ...

    def poll(self) -> Iterable[Record] | None:
        """Translate whatever the attempt wrote besides its record stream (called every tick).

        Records returned are the engine's own, from outside any rank's stream (Ray's controller
        saying a worker group failed); the supervisor handles them as if they were streamed.
        """
        ...

    def settle(self) -> None:
        """The attempt has exited: let its last output reach the record stream."""
        ...

    def training(self) -> None:
        """The attempt has made its first step: a source may now get ready for the next one."""
        ...

    def close(self) -> None:
        """The run has ended: stop whatever the source kept ready."""
        ...

    def standby_pid(self) -> int | None:
        """The spare worker waiting for the next attempt, if one is (``supervise/standby.py``)."""
        ...

    def checkpoints(self) -> list[Path]:
        """Every checkpoint folder, newest step first."""
        ...

    def problem(self, checkpoint: Path) -> str | None:
        """Why ``checkpoint`` cannot be resumed from; None when it is whole."""
        ...

    def latest_checkpoint(self) -> str | None: ...

    def resume_copy(self, checkpoint: Path) -> Path:
        """What a rollback at a lower LR resumes from ``checkpoint`` (the LR must survive the resume)."""
        ...

    def dump_stacks(self, tree: ProcessTree, proc: WorkerProcess, out: Path) -> list[int]:
        """Write the Python stacks of the attempt's processes to ``out``; the pids asked."""
        ...

    def steps_are_real(self) -> bool:
        """Step numbers come from the trainer's own counter (else they are counted from log lines)."""
        ...

    def describe(self) -> str: ...

    def write_env(self, sources: list[Path]) -> None:
        """Record the run's environment in ``env.json`` (``sources``: where the user's git tree may be)."""
        ...


def unable(source: WorkerSource, action: str) -> str | None:
    """Why ``source`` cannot carry out ``action`` (None: it can)."""
    if action in {"checkpoint", "memory_snapshot"} and CONTROL not in source.abilities:
        return (
            f"the {source.label} takes no control requests (supervise --inject gives an HF-based tool them)"
        )
    if action == "reduce_microbatch" and PLAN not in source.abilities:
        return f"the {source.label}'s batch shape is its own"
    return None


def run_worker_env(cfg: SteadytuneConfig, extra: dict[str, str] | None = None) -> dict[str, str]:
    """What every worker of the run is told on top of ``extra``, the first attempt's early spare as
    much as a later one (a spare whose environment differs from its attempt's is not taken):
    the stream's rotation size, since the writer of a file is the one that can rotate it."""
    return {**(extra or {}), SEGMENT_ENV: str(cfg.run.telemetry_segment_bytes)}


def attempt_env(extra: dict[str, str], attempt: int | None) -> dict[str, str]:
    """What the built-in worker gets on top of the supervisor's environment (``attempt`` None: a spare)."""
    env = {**extra, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    return env if attempt is None else {**env, "STEADYTUNE_ATTEMPT": str(attempt)}


def early_standby(cfg: SteadytuneConfig, run: RunDir) -> Standby | None:
    """Start the first attempt's worker process (its imports) while the preflight runs; None if it cannot.

    Only where a spare could take the first attempt: a single-process run of steadytune's own worker,
    with ``recover.standby_worker`` on, in a run folder not used before. It writes the run's
    ``config.yaml`` (the worker reads it to know what to import), which the run writes again, the same,
    when it starts; :func:`discard_early` undoes both on a NO-GO.
    """
    from steadytune.config.load import dump_config
    from steadytune.rundir import atomic_write_text

    if not cfg.recover.standby_worker or cfg.run.nproc_per_node > 1 or cfg.run.engine != "native":
        return None
    if run.root.exists():
        return None  # another run's folder, or one given twice: the run itself says what is wrong
    run.create()
    atomic_write_text(run.config, dump_config(cfg))
    early = Standby(run)
    early.prepare(attempt_env(run_worker_env(cfg), None), during="during the preflight")
    return early


def discard_early(early: Standby) -> None:
    """A NO-GO: stop the early spare and remove the run folder it was started in, which holds nothing else."""
    import shutil

    early.stop()
    shutil.rmtree(early.run.root, ignore_errors=True)


class NativeSource:
    """steadytune's own worker (``train/worker.py`` with the guard inside): every ability."""

    label = "worker"
    abilities = frozenset({PLAN, CONTROL, SKIP_STEP, LR, DATA, RELOAD})

    def __init__(
        self,
        run: RunDir,
        nproc_per_node: int = 1,
        env: dict[str, str] | None = None,
        standby: bool = False,
        early: Standby | None = None,
    ) -> None:
        """``early``: a spare started before the run for its first attempt (:func:`early_standby`)."""
        self.run, self.nproc, self.env = run, nproc_per_node, dict(env or {})
        self.checkpoint_root: Path | None = run.checkpoints
        # A spare worker for the next attempt (supervise/standby.py): one process only, so not for torchrun.
        self.standby = Standby(run) if standby and nproc_per_node <= 1 else None
        if self.standby is not None and early is not None:
            self.standby = early
        elif early is not None:
            early.stop()
        self.no_standby = (
            "recover.standby_worker is false"
            if not standby
            else f"run.nproc_per_node is {nproc_per_node}: the standby worker is one process"
        )
        self.attempts = 0

    def attempt_env(self, attempt: int | None) -> dict[str, str]:
        return attempt_env(self.env, attempt)

    def start(self, plan: PlanRevision, log_path: Path) -> WorkerProcess:
        clean_staging(self.run.staging)
        env = self.attempt_env(plan.attempt)
        # A resize (scale: in the config) relaunches with the plan's process count, not the first one.
        cmd = worker_command(self.run.root, plan.nproc_per_node or self.nproc)
        self.attempts += 1
        why = self.no_standby
        if self.attempts == 1 and (self.standby is None or not self.standby.ready):
            # No spare was started during a preflight (early_standby); a resumed run has none either.
            why = "the run's first attempt" if plan.attempt == 0 else "the first since the run resumed"
        elif self.standby is not None:
            spare, why = self.standby.take(cmd, env, log_path)
            if spare is not None:
                return spare
        proc = WorkerProcess(cmd, log_path, env=env)
        proc.how = f"a new process: {why}"
        return proc

    def poll(self) -> Iterable[Record] | None:
        return None

    def settle(self) -> None:
        return None

    def training(self) -> None:
        if self.standby is not None:
            self.standby.prepare(self.attempt_env(None))

    def close(self) -> None:
        if self.standby is not None:
            self.standby.stop()

    def standby_pid(self) -> int | None:
        return self.standby.pid if self.standby is not None else None

    def checkpoints(self) -> list[Path]:
        return list_checkpoints(self.run.checkpoints)

    def problem(self, checkpoint: Path) -> str | None:
        verdict = verify(checkpoint)  # the manifest: every file there, its size and sha256
        return None if verdict.ok else verdict.reason

    def resume_copy(self, checkpoint: Path) -> Path:
        return checkpoint  # the trainer keeps the plan's LR over the checkpoint's (guard/hf.py)

    def latest_checkpoint(self) -> str | None:
        latest = read_pointer(self.run.latest_pointer)
        return latest.name if latest else None

    def dump_stacks(self, tree: ProcessTree, proc: WorkerProcess, out: Path) -> list[int]:
        """Every rank has faulthandler on SIGUSR1 and writes its own stacks under ``stacks/``."""
        pids = proc.python_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR1)
            except (ProcessLookupError, PermissionError):
                continue
        if pids:
            time.sleep(1.0)  # faulthandler writes from a signal handler: give it a moment
        return pids

    def steps_are_real(self) -> bool:
        return True

    def describe(self) -> str:
        return f"{sys.executable} -m steadytune.train.worker"

    def write_env(self, sources: list[Path]) -> None:
        from steadytune.telemetry.runenv import write_run_env

        write_run_env(self.run, sources)  # the worker adds torch's readings (same interpreter)

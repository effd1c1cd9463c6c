"""The worker process: ``python -m steadytune.train.worker --run-dir runs/<id>``.

Started by the supervisor (directly, or under torchrun for several processes).
It reads the resolved config and the newest plan revision from the run
directory, trains with the guard inside, and says how it ended in its last
telemetry record before exiting:

- exit 0: completed, or stopped/paused on request (a checkpoint was written);
- exit 1: an error (the record says whether it is deterministic);
- killed by a signal: nothing is written; the supervisor sees the signal.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from steadytune.records import PlanRevision
from steadytune.rundir import RunDir
from steadytune.telemetry.stream import latest_plan

if TYPE_CHECKING:
    from steadytune.config.schema import SteadytuneConfig
    from steadytune.guard.core import Guard
    from steadytune.guard.hf import GuardCallback


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="steadytune-worker")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument(
        "--standby",
        action="store_true",
        help="import, then wait for an attempt's orders on stdin (train/standby.py)",
    )
    args = parser.parse_args(argv)
    run = RunDir(args.run_dir)

    from steadytune.config.load import load_config
    from steadytune.train.lean import hide_unneeded

    try:
        cfg: SteadytuneConfig | None = load_config(run.config, check_paths=False)
    except Exception:
        cfg = None  # read again inside the attempt, whose guard reports the error as it always has
    if cfg is not None:
        # Before transformers is first imported: a restart after a kill waits on this start-up.
        hide_unneeded(cfg)
    if args.standby:
        from steadytune.train.standby import stand_by

        if not stand_by(cfg):
            return 0  # the supervisor ended without needing it
    plan = latest_plan(run)  # read only now: a standby worker's attempt is planned after it started

    run.stacks.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    # SIGUSR1 dumps every thread's Python stack: the supervisor uses it on a hang.
    stack_file = open(run.stacks / f"rank-{rank}-attempt-{plan.attempt}.txt", "a")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    return train_attempt(run, plan, rank, cfg=cfg)


def train_attempt(
    run: RunDir,
    plan: PlanRevision,
    rank: int,
    announce: Callable[[Guard], None] | None = None,
    main_thread: bool = True,
    cfg: SteadytuneConfig | None = None,
) -> int:
    """Train one attempt of ``plan`` with the guard inside; the exit code of the worker.

    The same path for every engine: steadytune's own worker calls it, and so does each
    Ray Train worker (``engines/ray_worker.py``). ``announce`` runs once the guard is up,
    before the model loads, so what it writes comes first in this attempt's stream.
    ``main_thread`` is False where SIGTERM is not ours to handle (Ray runs the training
    function in a thread of its own worker actor, and stops it through the control queue).
    ``cfg`` is the run's config where the caller has read it already (else it is read here).
    """
    from steadytune.config.load import load_config
    from steadytune.guard.core import Guard

    guard = Guard(run.root, rank=rank, attempt=plan.attempt)
    guard.start_heartbeats()
    callback = None
    try:
        if announce is not None:
            announce(guard)
        from steadytune.telemetry.runenv import add_worker_details

        add_worker_details(run, rank, plan.attempt)  # torch's readings into env.json (docs/run-directory.md)
        from steadytune.guard.checkpoints import CheckpointKeeper
        from steadytune.guard.faults import Faults
        from steadytune.guard.hf import GuardCallback
        from steadytune.train.runner import build_trainer

        if cfg is None:
            cfg = load_config(run.config, check_paths=False)
        if cfg.train.per_device_train_batch_size == "auto" and plan.per_device_train_batch_size is None:
            # auto micro-batch (docs/preflight.md): found once, before the model loads; the supervisor
            # records it as a plan revision, so a restart trains the same shape without searching again.
            from steadytune.train.autobatch import apply_auto_micro_batch

            plan = apply_auto_micro_batch(cfg, plan, guard)
        faults = Faults.from_env()
        keeper = CheckpointKeeper(
            run,
            keep_last=cfg.run.keep_last,
            min_free_bytes=cfg.run.min_free_disk_bytes,
            save_fault=lambda step: faults.in_save_window(step, guard.attempt, run.events),
        )
        callback = GuardCallback(guard, keeper, run.staging, faults, cfg.policy.checkpoint_every_s)
        callback.reloads = True  # this worker rebuilds its own trainer: a rollback may happen in process
        if main_thread:
            signal.signal(signal.SIGTERM, lambda *_: callback.request_stop("SIGTERM"))
        trainer = build_trainer(
            cfg,
            plan,
            guard,
            [callback],
            run.staging,
            faults=faults,
            max_split=cfg.policy.max_microbatch_split,
        )
        from steadytune.guard.memcap import apply_memory_cap
        from steadytune.train.rollback import train_with_rollbacks

        apply_memory_cap()  # a server job's --memory-cap-gib, on the device the trainer has set
        train_with_rollbacks(trainer, callback, guard, run, cfg, plan)
        status = callback.stop_status or "completed"
        if status == "completed" and trainer.is_world_process_zero():
            trainer.save_model(str(run.root / "final"))
        guard.close(status)
        return 0
    except BaseException as exc:
        return _attempt_failed(guard, callback, exc)


def _attempt_failed(guard: Guard, callback: GuardCallback | None, exc: BaseException) -> int:
    """End an attempt that raised: keep its sealed checkpoints, say how it ended; the exit code."""
    if callback is not None:
        try:
            callback.wait_for_saves()  # a checkpoint sealed before the failure stays usable
        except BaseException as publish_error:
            print(f"checkpoint publishing failed too: {publish_error!r}", file=sys.stderr)
    if isinstance(exc, KeyboardInterrupt):
        guard.close("stopped")
        return 130
    tb = "".join(traceback.format_exception(exc))[-4000:]
    # Failing before a single step of this attempt completed means the inputs are at
    # fault (bad path, bad data, bad config, broken code): a restart would fail the same way.
    # A rollback that could not happen in process is for a new process to do: not the inputs' fault.
    deterministic = guard.steps_this_attempt == 0 and not getattr(exc, "for_a_new_process", False)
    guard.close("error", exc, traceback_tail=tb, deterministic=deterministic)
    print(tb, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""HF Trainer adapter: translates ``TrainerCallback`` hooks into guard calls, and
guard decisions back into ``TrainerControl``. No policy lives here.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from transformers import Trainer, TrainerCallback

from steadytune.guard.checkpoints import CheckpointKeeper
from steadytune.guard.core import Guard
from steadytune.guard.faults import Faults
from steadytune.guard.gradflow import DEFAULT_INTERVAL, columns, layer_grad_stats, should_record, unclip_scale
from steadytune.objectives import OBJECTIVE_KEY, objective_of_trainer
from steadytune.protocol import WorkerEvent
from steadytune.records import logged_extra


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _agreed(request: dict[str, Any] | None) -> dict[str, Any] | None:
    """Rank 0's request, on every rank: ranks that read the queue on their own may see a request one
    step apart, and a rank that stops (and saves, with barriers) while another trains deadlocks both."""
    import torch.distributed as dist

    box = [request]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _calling_trainer(callback: TrainerCallback) -> Trainer | None:
    """The Trainer whose loop is calling ``callback``: HF hands callbacks no reference to it."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        obj = frame.f_locals.get("self")
        if isinstance(obj, Trainer) and any(cb is callback for cb in obj.callback_handler.callbacks):
            return obj
        frame = frame.f_back
    return None


class GuardCallback(TrainerCallback):
    """Wires a :class:`Guard` and a :class:`CheckpointKeeper` into the HF Trainer loop.

    Add it to any ``Trainer`` (``callbacks=[...]``): it binds itself to that trainer when
    training begins (see :meth:`bind`).

    Without a keeper the checkpoints stay where the trainer writes them (its ``output_dir``):
    they are reported, not published, and the trainer's own save schedule is left alone
    (``final_checkpoint=False`` also leaves the end of training to it). That is how the guard
    rides in a tool's trainer (:mod:`steadytune.inject`).
    """

    def __init__(
        self,
        guard: Guard,
        keeper: CheckpointKeeper | None,
        staging: Path | None,
        faults: Faults | None = None,
        checkpoint_every_s: float | None = None,
        gradflow_every: int = DEFAULT_INTERVAL,
        final_checkpoint: bool = True,
    ) -> None:
        self.guard = guard
        self.faults = faults or Faults()
        self.checkpoint_every_s = checkpoint_every_s
        self._last_save_ts = guard.clock()
        self._lr_saved: list[float] | None = None
        self._gradflow: dict[str, Any] | None = None
        self.gradflow_every = gradflow_every
        self.keeper = keeper
        self.staging = staging
        self.final_checkpoint = final_checkpoint
        self.stop_status: str | None = None  # "stopped" / "paused" once a request ends the run
        # Publishing (fsync, hash, rename, manifest) runs on this thread while training goes on.
        self._publishing: threading.Thread | None = None
        self._publish_error: BaseException | None = None
        self._external_stop: str | None = None
        self._bound = False  # whether some trainer's clipping reports its norm to the guard
        self._logging: tuple[int, float] | None = None  # (step, when it ended) of a step whose log is due
        self.objective: str | None = None  # an RL or preference trainer's objective, once bound to it
        # In-process rollback (train/rollback.py): only a worker that can reload its trainer enables it.
        self.reloads = False
        self._rollback: dict[str, Any] | None = None  # the request taken, until the worker picks it up
        self._reload: tuple[float, Any] | None = None  # (when it began, the plan) until training begins again

    def bind(self, trainer: Trainer) -> bool:
        """Let the guard see the gradient norm the trainer's clipping computes.

        HF clips right after the last backward and only then calls ``on_pre_optimizer_step``
        (its docstring: "after gradient clipping"); no callback hook runs in between. A callback
        alone would read clipped gradients, so a norm of at most ``max_grad_norm`` that hides
        every spike. ``Trainer._clip_grad_norm`` returns the norm before clipping (and is what
        HF logs as ``grad_norm``): wrapping it on this instance hands that tensor to the guard
        with no second pass over the gradients. Idempotent; False when the trainer has no
        ``_clip_grad_norm`` (the guard then records clipped norms).
        """
        # What the trainer optimises, by its class (a TRL DPOTrainer, ...): its first record says so.
        self.objective = objective_of_trainer(c.__name__ for c in type(trainer).__mro__)
        clip = getattr(trainer, "_clip_grad_norm", None)
        if clip is None:
            return False
        if getattr(clip, "steadytune_guard", None) is self.guard:
            self._bound = True
            return True

        def clip_and_observe(model: Any) -> Any:
            norm = clip(model)
            self.guard.observe_grad_norm(norm)
            return norm

        clip_and_observe.steadytune_guard = self.guard  # type: ignore[attr-defined]
        trainer._clip_grad_norm = clip_and_observe  # type: ignore[method-assign]
        self._bound = True
        return True

    def take_rollback(self) -> dict[str, Any] | None:
        """The ``rollback`` request that ended the training loop, once; None when none did."""
        request, self._rollback = self._rollback, None
        return request

    def expect_reload(self, plan: Any) -> None:
        """The next ``train()`` reloads ``plan``'s checkpoint in process: its start is reported as such."""
        self._reload = (self.guard.clock(), plan)

    def _report_reload(self, state: Any) -> None:
        began, plan = self._reload  # type: ignore[misc]
        self._reload = None
        seconds = self.guard.clock() - began
        name = Path(plan.resume_checkpoint).name
        self.guard.notify(
            "lifecycle",
            WorkerEvent.ROLLED_BACK,
            f"rolled back in process to {name} in {seconds:.2f}s (weights, optimizer, scheduler; "
            f"LR x{plan.lr_scale:g}, {sum(b - a + 1 for a, b in plan.skip_ranges)} samples skipped)",
            step=state.global_step,
            checkpoint=plan.resume_checkpoint,
            reload_s=round(seconds, 4),
            revision=plan.revision,
            in_process=True,
        )

    def _take_rollback_request(self, request: dict[str, Any], control: Any) -> None:
        if not self.reloads:
            self.guard.notify(
                "action",
                WorkerEvent.ROLLBACK_FAILED,
                "in-process rollback refused: this trainer cannot reload in process",
                severity="warning",
                reason="not supported by this trainer",
            )
            return
        # The loop ends here, unsaved: a checkpoint of the timeline being abandoned must not be written.
        self._rollback = request
        control.should_training_stop = True

    def request_stop(self, why: str) -> None:
        """Called from a signal handler: act at the next step boundary, never mid-step."""
        self._external_stop = why

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        trainer = _calling_trainer(self)
        bound = self.bind(trainer) if trainer is not None else self._bound
        if (args.max_grad_norm or 0) > 0 and not bound:
            self.guard.notify(
                "lifecycle",
                WorkerEvent.GRAD_NORM_AFTER_CLIPPING,
                "the trainer's clipping could not be "
                "observed: grad_norm and gradient flow are recorded after clipping",
                severity="warning",
            )
        self.guard.last_step = state.global_step
        self._logging = None  # a log due in a train() that ended (a rollback's) is not this one's
        self._last_save_ts = self.guard.clock()
        self.guard.notify(
            "lifecycle",
            WorkerEvent.TRAIN_BEGIN,
            f"training from step {state.global_step} to {state.max_steps}",
            max_steps=state.max_steps,
            start_step=state.global_step,
        )
        self.guard.watch()  # RSS and the control queue, read off the step loop
        if self._reload is not None:
            self._report_reload(state)
        self.guard.set_phase("train")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._log_that_never_came(state, control)
        if self._publish_error is not None:
            self.wait_for_saves()  # raises it: a save that failed fails the worker, as it did in on_save
        self.guard.begin_step()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        optimizer = kw.get("optimizer")
        burst = self.faults.lr_factor(state.global_step + 1, self.guard.attempt)
        if burst != 1.0 and optimizer is not None:
            self._lr_saved = [g["lr"] for g in optimizer.param_groups]
            for g in optimizer.param_groups:
                g["lr"] *= burst
        step = state.global_step + 1
        # Per-layer gradient flow every few steps: it reads every gradient, so never on every step.
        # The gradients are already clipped here; the norm clipping computed scales them back. That
        # is also right under fp16, where only clipping unscales the loss-scaled gradients, so they
        # could not be read earlier. Its host read costs nothing extra: the NaN guard needs it anyway.
        flow = None
        if should_record(step, self.gradflow_every):
            scale = unclip_scale(self.guard.observed_grad_norm(), args.max_grad_norm or 0.0)
            flow = columns(layer_grad_stats(kw["model"], scale=scale))
        ok = self.guard.before_update(kw["model"], optimizer)
        self._gradflow = flow if ok else None  # a skipped (non-finite) update is the NaN guard's story
        if not ok:
            self.guard.notify(
                "action",
                WorkerEvent.SKIP_STEP,
                f"non-finite loss or gradient at step {state.global_step + 1}: update skipped",
                severity="warning",
                step=state.global_step + 1,
                consecutive=self.guard.consecutive_skips,
            )

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        saved = getattr(self, "_lr_saved", None)
        if saved is not None and kw.get("optimizer") is not None:
            for g, lr in zip(kw["optimizer"].param_groups, saved, strict=True):
                g["lr"] = lr
            self._lr_saved = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if control.should_log:
            # The trainer logs this step right after this hook (HF's _maybe_log_save_evaluate, before any
            # evaluation or save): the step's record waits for that log, so the fields only the trainer
            # computes (a TRL trainer's reward, KL, margins) are in it and are judged at this very step.
            self._logging = (state.global_step, self.guard.clock())
            return
        self._end_step(state, control, None, None)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
        due = self._logging
        # The training log has the loss; an evaluation's log (eval_*) and the run's summary do not.
        if due is None or due[0] != state.global_step or not logs or "loss" not in logs:
            return
        self._logging = None
        self._end_step(state, control, due[1], logged_extra(logs))

    def _log_that_never_came(self, state: Any, control: Any) -> None:
        """A step the trainer said it would log, whose log it never handed the callbacks (a trainer
        that logs its own way): its record is written without the trainer's fields, before anything else."""
        if self._logging is not None:
            ended, self._logging = self._logging[1], None
            self._end_step(state, control, ended, None)

    def _end_step(
        self, state: Any, control: Any, ended_at: float | None, logged: dict[str, Any] | None
    ) -> None:
        """The step boundary: the step's record, then drill faults, control requests and the save decision."""
        extra: dict[str, Any] = dict(logged) if logged else {}
        if self._gradflow:
            extra["gradflow"] = self._gradflow
        if self.objective is not None and self.guard.steps_this_attempt == 0:
            # The detectors name the objective from the first record, which may be one the trainer does
            # not log (logging_steps > 1): the trainer's class names it there.
            extra[OBJECTIVE_KEY] = self.objective
        self.guard.end_step(state.global_step, epoch=state.epoch, extra=extra or None, ended_at=ended_at)
        self._gradflow = None  # the step record itself is the loop's heartbeat: no second line per step
        held = self.faults.after_step(state.global_step, self.guard.attempt, self.guard.run.events)
        world = _world_size()
        # With several ranks, rank 0 alone reads the queue (and its own SIGTERM, which torchrun
        # forwards to every rank) and the others take its request at the same step boundary.
        request = self.guard.poll_control(fresh=held) if world == 1 or self.guard.rank == 0 else None
        if (
            request is not None
            and request.get("command") == "pause"
            and request.get("args", {}).get("mode") == "hold"
        ):
            self._hold(request, state.global_step)
            request = None
        if request is None and self._external_stop and (world == 1 or self.guard.rank == 0):
            request = {
                "command": "stop",
                "id": f"signal-{self._external_stop}",
                "issuer": self._external_stop,
            }
            self._external_stop = None
        if world > 1:
            request = _agreed(request)
        if request is not None and request.get("command") == "memory_snapshot":
            self._memory_snapshot(request, state.global_step)
            request = None
        if request is not None:
            command = str(request.get("command"))
            self.guard.notify(
                "control",
                WorkerEvent.ack(command),
                f"worker acting on '{command}'",
                request_id=request.get("id"),
                issuer=request.get("issuer"),
            )
            if command in {"checkpoint", "stop", "pause"}:
                control.should_save = True
            if command in {"stop", "pause"}:
                control.should_training_stop = True
                self.stop_status = "paused" if command == "pause" else "stopped"
            if command == "rollback":
                self._take_rollback_request(request, control)
        if self.final_checkpoint and state.global_step >= state.max_steps > 0:
            control.should_save = True  # always end on a verified checkpoint
        if self.checkpoint_every_s and self.guard.clock() - self._last_save_ts >= self.checkpoint_every_s:
            control.should_save = True  # bound the work a crash can lose, in time, not only in steps
        if self._rollback is not None:
            control.should_save = control.should_evaluate = False
        if control.should_save:
            reason = self.keeper.check_disk() if self.keeper is not None else None
            if reason is not None:
                control.should_save = False
                self.guard.notify(
                    "anomaly",
                    WorkerEvent.DISK_LOW,
                    f"checkpoint at step {state.global_step} skipped: {reason}",
                    severity="critical",
                )
        # The trainer evaluates before it saves: the phase names what the loop waits on first
        # (on_evaluate then moves it on to the save), so an evaluation is never counted as a save.
        if control.should_evaluate:
            self.guard.set_phase("eval")
        elif control.should_save:
            self.guard.set_phase("save")

    def _memory_snapshot(self, request: dict[str, Any], step: int) -> None:
        """A CUDA allocator snapshot into ``stacks/`` (a no-op that says so on CPU)."""
        from steadytune.guard.memsnap import dump_cuda_snapshot

        path = self.guard.run.stacks / f"memory-rank{self.guard.rank}-step{step}.pickle"
        result = dump_cuda_snapshot(path)
        self.guard.notify(
            "control",
            WorkerEvent.ACK_MEMORY_SNAPSHOT,
            result.message,
            request_id=request.get("id"),
            issuer=request.get("issuer"),
            path=str(result.path) if result.written else None,
        )

    def _hold(self, request: dict[str, Any], step: int) -> None:
        """``pause --hold``: stay in memory at this step boundary until a ``resume`` request."""
        self.guard.notify(
            "control",
            WorkerEvent.ACK_PAUSE,
            f"worker paused in memory at step {step}",
            request_id=request.get("id"),
            issuer=request.get("issuer"),
            mode="hold",
        )
        self.guard.set_phase("paused")
        # Requests other than resume or stop (a checkpoint) wait for the resume, in their order.
        self.guard.put_back(self._hold_until_released(step))

    def _hold_until_released(self, step: int) -> list[dict[str, Any]]:
        later: list[dict[str, Any]] = []
        while True:
            time.sleep(0.5)
            nxt = self.guard.poll_control()
            if nxt is not None and nxt.get("command") not in {"resume", "stop"}:
                later.append(nxt)
                continue
            if nxt is not None:
                self.guard.notify(
                    "control",
                    WorkerEvent.ack(nxt["command"]),
                    f"worker {nxt['command']}d at step {step}",
                    request_id=nxt.get("id"),
                    issuer=nxt.get("issuer"),
                )
                self.guard.set_phase("train")
                if nxt["command"] == "stop":
                    self._external_stop = nxt.get("issuer") or "operator"
                return later
            if self._external_stop:
                self.guard.set_phase("train")
                return later

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._log_that_never_came(state, control)
        _barrier()  # every rank has written its RNG state into the staging folder
        if state.is_world_process_zero:
            staged = (self.staging or Path(args.output_dir)) / f"checkpoint-{state.global_step}"
            if staged.is_dir():
                if self.keeper is None:
                    # Reported where the trainer wrote it: the supervisor may run elsewhere.
                    self._report_saved(staged.resolve(), state.global_step)
                else:
                    # HF has written every file; making them durable and hashing them (most of a
                    # save's cost beyond HF's own) overlaps the next steps. One save at a time, in order.
                    self.wait_for_saves()
                    # Written before the next step's record: a supervisor deciding a rollback on that step
                    # knows this checkpoint is on its way and waits for it (docs/recovery.md).
                    self.guard.notify(
                        "lifecycle",
                        WorkerEvent.CHECKPOINT_PUBLISHING,
                        f"publishing {staged.name}",
                        step=state.global_step,
                    )
                    self._publishing = threading.Thread(
                        target=self._publish, args=(staged, state.global_step), name="steadytune-publish"
                    )
                    self._publishing.start()
        _barrier()
        self._last_save_ts = self.guard.clock()
        self.guard.set_phase("eval" if control.should_evaluate else "train")

    def _publish(self, staged: Path, step: int) -> None:
        try:
            assert self.keeper is not None
            final = self.keeper.publish(
                staged, step, extra={"attempt": self.guard.attempt, "format": "hf-trainer"}
            )
            self._report_saved(final, step)
        except BaseException as exc:  # handed to the training thread: it fails there, at the next step
            self._publish_error = exc
            self.guard.notify(
                "lifecycle",
                WorkerEvent.CHECKPOINT_PUBLISH_FAILED,
                f"publishing checkpoint-{step} failed: {type(exc).__name__}: {exc}",
                severity="warning",
                step=step,
                error=f"{type(exc).__name__}: {exc}",
            )

    def _report_saved(self, final: Path, step: int) -> None:
        size = sum(p.stat().st_size for p in final.rglob("*") if p.is_file())
        self.guard.notify(
            "lifecycle",
            WorkerEvent.CHECKPOINT_SAVED,
            f"saved {final.name}",
            step=step,
            path=str(final),
            bytes=size,
        )

    def wait_for_saves(self) -> None:
        """Block until the checkpoint being published is sealed; raise what its publishing raised.

        Called before the next save, at the end of training and by the worker before it exits
        on an error, so no verified checkpoint is lost to the process ending under it.
        """
        thread, self._publishing = self._publishing, None
        if thread is not None:
            thread.join()
        error, self._publish_error = self._publish_error, None
        if error is not None:
            raise error

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._log_that_never_came(state, control)
        # The loop is over: the last publish and the final model follow, and no step will. Silence
        # there is no hang (on a loaded machine a drill's 8 s hang floor called one, and restarted a
        # run that had finished its last step).
        self.guard.set_phase("finish")
        self.wait_for_saves()

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: dict | None = None, **kw: Any
    ) -> None:
        self._log_that_never_came(state, control)
        if metrics and "eval_loss" in metrics:
            self.guard.record_eval(state.global_step, metrics["eval_loss"])
        self.guard.set_phase("save" if control.should_save else "train")


def restore_base_lrs(
    optimizer: Any, scheduler: Any, fresh: list[float]
) -> tuple[list[float], list[float]] | None:
    """Put back the per-group base LRs the trainer was built with, after a checkpoint's state replaced them.

    Each group keeps its place in the schedule; only its base changes. Returns the
    (checkpoint's, this run's) base LRs when they differed and were replaced, else None
    (also when the shapes differ: not ours to guess).
    """
    loaded = list(getattr(scheduler, "base_lrs", None) or [])
    groups = getattr(optimizer, "param_groups", None) or []
    if not loaded or len(loaded) != len(fresh) or len(groups) != len(fresh) or loaded == fresh:
        return None
    for group, old, new in zip(groups, loaded, fresh, strict=True):
        group["initial_lr"] = new
        group["lr"] = group["lr"] * new / old if old else new
    scheduler.base_lrs = list(fresh)
    if hasattr(scheduler, "_last_lr"):
        scheduler._last_lr = [g["lr"] for g in groups]
    return loaded, list(fresh)


def load_keeping_this_runs_lr(
    trainer: Any, load: Any, checkpoint: str | None
) -> tuple[list[float], list[float]] | None:
    """Resume the checkpoint's optimizer and scheduler, but at the learning rate this run was given.

    The HF Trainer builds a fresh optimizer and scheduler at ``args.learning_rate`` and then
    loads the checkpoint's ``optimizer.pt`` and ``scheduler.pt`` over them: their base LR is
    the one the checkpoint was trained at, so a rollback's lower LR would be silently undone.
    The schedule's position and the optimizer's moments are kept (:func:`restore_base_lrs`).
    """

    def inner(sched: Any) -> Any:
        return getattr(sched, "scheduler", sched)  # accelerate wraps it

    fresh = list(getattr(inner(getattr(trainer, "lr_scheduler", None)), "base_lrs", None) or [])
    load(checkpoint)
    if checkpoint is None or not fresh:
        return None
    return restore_base_lrs(trainer.optimizer, inner(trainer.lr_scheduler), fresh)

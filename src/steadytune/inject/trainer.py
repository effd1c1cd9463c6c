"""The guard inside a tool's own HF ``Trainer`` (LLaMA-Factory, TRL, axolotl, plain scripts).

:func:`install` wraps four methods of ``transformers.Trainer`` itself, so every
subclass that calls ``super()`` carries the guard without knowing it:

- ``__init__``: the trainer gets a :class:`~steadytune.guard.hf.GuardCallback` (the one
  the built-in runner uses) bound to its clipping, so records hold the norm before clipping;
- ``training_step``: each micro-batch's loss, tokens and content hashes go to the guard;
- ``train``: the guard's last words (:class:`~steadytune.records.WorkerExit`) when it returns or raises;
- ``_load_optimizer_and_scheduler`` (where present): on a resume, the command's learning rate
  replaces the checkpoint's, so a rollback's lowered LR reaches the optimizer (see :func:`command_lr`).

With a ``nan_at_step`` drill fault planned, each new trainer's own ``compute_loss`` (whatever its
class makes of it: TRL's ``SFTTrainer`` never calls ``Trainer.compute_loss``) is wrapped on the
instance, so the fault poisons the loss that ``training_step`` backpropagates, as in the built-in runner.

The callback is the same adapter as in a native run, with no keeper: checkpoints stay
in the tool's ``output_dir`` and the tool's save schedule is its own. Whatever fails in
the guard switches the guard off with one line on stderr; the tool's training goes on.
Only the drill faults (``$STEADYTUNE_FAULTS``) are let through, as they are meant to be.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import signal
import traceback
import types
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer

from steadytune.guard.core import Guard
from steadytune.guard.faults import Faults, InjectedCrash
from steadytune.guard.fingerprint import batch_hashes
from steadytune.guard.hf import GuardCallback, load_keeping_this_runs_lr
from steadytune.inject.env import RUN_ENV
from steadytune.inject.say import warn
from steadytune.protocol import WorkerEvent
from steadytune.rundir import RunDir
from steadytune.telemetry.runenv import add_worker_details

_CALLBACK = "_steadytune_callback"  # the trainer instance's InjectedCallback
_MARK = "_steadytune_injected"  # set on the patched Trainer class
# Raised on purpose by drills, or real: never swallowed by the guard's own safety net.
_PASS_THROUGH: tuple[type[BaseException], ...] = (InjectedCrash, torch.OutOfMemoryError)


class InjectedCallback(GuardCallback):
    """:class:`GuardCallback` that turns itself off, rather than stop the tool, when it fails."""

    off = False

    def switch_off(self, exc: BaseException) -> None:
        self.off = True
        warn("guard switched off", exc)
        try:
            self.guard.notify(
                "lifecycle", WorkerEvent.GUARD_OFF, f"injected guard switched off: {exc}", severity="warning"
            )
        except Exception:
            pass


def _safe(method: Any) -> Any:
    @functools.wraps(method)
    def event(self: InjectedCallback, *args: Any, **kwargs: Any) -> Any:
        if self.off:
            return None
        try:
            return method(self, *args, **kwargs)
        except _PASS_THROUGH:
            raise
        except Exception as exc:
            self.switch_off(exc)
            return None

    return event


for _name, _method in list(vars(GuardCallback).items()):
    if _name.startswith("on_") and callable(_method):
        setattr(InjectedCallback, _name, _safe(_method))


class Injection:
    """This process's guard: opened by the first trainer, closed when its ``train()`` ends."""

    def __init__(self, run_root: Path, faults: Faults) -> None:
        self.run = RunDir(run_root)
        self.faults = faults
        self.guard: Guard | None = None
        self._stacks: Any = None

    def open_guard(self) -> Guard:
        if self.guard is None:
            self.guard = Guard(self.run.root)  # rank and attempt from $RANK and $STEADYTUNE_ATTEMPT
            self.guard.start_heartbeats()
            self._dump_stacks_on_sigusr1(self.guard)
            # torch's own readings (cuDNN, the devices it sees) into env.json, as a native worker's:
            # the supervisor read the command's torch from its files only. Never raises.
            add_worker_details(self.run, self.guard.rank, self.guard.attempt)
        return self.guard

    def _dump_stacks_on_sigusr1(self, guard: Guard) -> None:
        # As in a native worker: the supervisor asks a hung trainer for its stacks with SIGUSR1.
        # Only when the tool has no handler of its own (the default action would kill it).
        if self._stacks is not None or signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL:
            return
        self.run.stacks.mkdir(parents=True, exist_ok=True)
        path = self.run.stacks / f"rank-{guard.rank}-attempt-{guard.attempt}.txt"
        self._stacks = open(path, "a")  # noqa: SIM115  (open for the life of the process)
        faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)

    def attach(self, trainer: Trainer) -> None:
        if trainer.__dict__.get(_CALLBACK) is not None:
            return  # a subclass's __init__ chain reached Trainer.__init__ twice
        guard = self.open_guard()
        from steadytune.guard.memcap import apply_memory_cap

        apply_memory_cap()  # a server job's --memory-cap-gib: the trainer's arguments have set the device
        callback = InjectedCallback(guard, None, None, self.faults, final_checkpoint=False)
        trainer.add_callback(callback)
        callback.bind(trainer)
        trainer.__dict__[_CALLBACK] = callback
        if self.faults.nan_at_step is not None:
            # The instance's attribute comes before any class's method: the subclass's own compute_loss,
            # which training_step calls, is the one wrapped, once.
            trainer.__dict__["compute_loss"] = types.MethodType(
                _faulty_loss(type(trainer).compute_loss), trainer
            )
        guard.notify(
            "lifecycle",
            WorkerEvent.GUARD_INJECTED,
            f"guard injected into {type(trainer).__module__}.{type(trainer).__qualname__}",
            trainer=f"{type(trainer).__module__}.{type(trainer).__qualname__}",
            # HF fills in output_dir before a Trainer exists.
            output_dir=str(Path(trainer.args.output_dir).resolve()),  # type: ignore[arg-type]
        )

    def begin(self, callback: InjectedCallback) -> None:
        callback.guard = self.open_guard()  # a second train() gets a fresh stream writer
        callback.stop_status = None

    def finish(self, callback: InjectedCallback, error: BaseException | None) -> None:
        guard, self.guard = self.guard, None
        if guard is None:
            return
        if error is None:
            guard.close(callback.stop_status or "completed")
        elif isinstance(error, KeyboardInterrupt):
            guard.close("stopped")
        else:
            tail = "".join(traceback.format_exception(error))[-4000:]
            # As in a native worker: failing before one step of this attempt means the inputs are at fault.
            guard.close("error", error, traceback_tail=tail, deterministic=guard.steps_this_attempt == 0)


def _callback(trainer: Trainer) -> InjectedCallback | None:
    cb = trainer.__dict__.get(_CALLBACK)
    return cb if cb is not None and not cb.off else None


def install(trainer_cls: type[Trainer], environ: dict[str, str] | None = None) -> None:
    """Patch ``trainer_cls`` (``transformers.Trainer``) to carry the guard. Idempotent.

    Raises on a bad ``$STEADYTUNE_FAULTS`` or a missing ``$STEADYTUNE_INJECT_RUN`` before
    anything is patched, so a failure leaves the class as it was.
    """
    env = os.environ if environ is None else environ
    if trainer_cls.__dict__.get(_MARK):
        return
    if not env.get(RUN_ENV):
        raise ValueError(f"${RUN_ENV} is not set: no run directory to write the guard's telemetry to")
    injection = Injection(Path(env[RUN_ENV]), Faults.from_env(dict(env)))
    load_state = getattr(trainer_cls, "_load_optimizer_and_scheduler", None)
    if load_state is not None:
        trainer_cls._load_optimizer_and_scheduler = _keeping_the_commands_lr(load_state)  # type: ignore[method-assign]
    trainer_cls.__init__ = _attaching(trainer_cls.__init__, injection)  # type: ignore[method-assign]
    trainer_cls.train = _guarding_train(trainer_cls.train, injection)  # type: ignore[method-assign]
    trainer_cls.training_step = _watching_step(trainer_cls.training_step)  # type: ignore[method-assign]
    setattr(trainer_cls, _MARK, True)


# -- the guard's part in each patched Trainer method: the original is always called ------------------


def _attaching(init: Any, injection: Injection) -> Any:
    """``__init__``: the guard's callback joins the new trainer."""

    @functools.wraps(init)
    def __init__(self: Trainer, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            injection.attach(self)
        except Exception as exc:
            warn("guard not injected", exc)

    return __init__


def _guarding_train(train: Any, injection: Injection) -> Any:
    """``train``: the attempt begins before it and ends after it, with how it ended."""

    @functools.wraps(train)
    def train_(self: Trainer, *args: Any, **kwargs: Any) -> Any:
        cb = _callback(self)
        if cb is not None:
            try:
                injection.begin(cb)
            except Exception as exc:
                cb.switch_off(exc)
                cb = None
        try:
            result = train(self, *args, **kwargs)
        except BaseException as exc:
            _finish(injection, cb, exc)
            raise
        _finish(injection, cb, None)
        return result

    return train_


def _watching_step(training_step: Any) -> Any:
    """``training_step``: each micro-batch's loss, tokens and sample hashes reach the guard (and a
    planned OOM fault fires before it)."""

    @functools.wraps(training_step)
    def training_step_(self: Trainer, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        cb = _callback(self)
        if cb is None:
            return training_step(self, model, inputs, *args, **kwargs)
        ids = mask = None
        try:
            ids, mask = inputs.get("input_ids"), inputs.get("attention_mask")
            rows = int(ids.shape[0]) if ids is not None else 0
        except Exception:
            rows = 0
        cb.faults.check_oom(self.state.global_step + 1, cb.guard.attempt, rows)
        loss = training_step(self, model, inputs, *args, **kwargs)
        try:
            cb.guard.add_microbatch(
                loss,
                tokens=int(mask.sum()) if mask is not None else None,
                sample_hashes=batch_hashes(ids, mask) if ids is not None else None,
            )
        except Exception as exc:
            cb.switch_off(exc)
        return loss

    return training_step_


def _faulty_loss(compute_loss: Any) -> Any:
    """``compute_loss``: a planned NaN fault poisons the loss of its step (training only)."""

    @functools.wraps(compute_loss)
    def compute_loss_(self: Trainer, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        out = compute_loss(self, model, inputs, *args, **kwargs)
        cb = _callback(self)
        if cb is None or not model.training:
            return out
        return cb.faults.poison_loss(out, self.state.global_step + 1, cb.guard.attempt, cb.guard)

    return compute_loss_


def _keeping_the_commands_lr(load_state: Any) -> Any:
    """``_load_optimizer_and_scheduler``: a rollback's lower LR (the tool's own LR argument) must
    survive the checkpoint's scheduler."""

    @functools.wraps(load_state)
    def _load_optimizer_and_scheduler(self: Trainer, checkpoint: Any, *args: Any, **kwargs: Any) -> Any:
        cb = _callback(self)
        if cb is None:
            return load_state(self, checkpoint, *args, **kwargs)
        loaded = False

        def load(c: Any) -> None:
            nonlocal loaded
            load_state(self, c, *args, **kwargs)
            loaded = True

        try:
            changed = load_keeping_this_runs_lr(self, load, checkpoint)
        except Exception as exc:
            cb.switch_off(exc)
            if not loaded:
                load_state(self, checkpoint, *args, **kwargs)
            return None
        if changed is not None:
            cb.guard.notify(
                "lifecycle",
                WorkerEvent.LR_FROM_COMMAND,
                f"resuming from {Path(str(checkpoint)).name} at the command's learning rate "
                f"{changed[1][0]:.6g}, not the checkpoint's {changed[0][0]:.6g}",
                checkpoint_lrs=changed[0],
                command_lrs=changed[1],
            )
        return None

    return _load_optimizer_and_scheduler


def _finish(injection: Injection, cb: InjectedCallback | None, error: BaseException | None) -> None:
    if cb is None:
        return
    try:
        injection.finish(cb, error)
    except Exception as exc:
        warn("guard switched off", exc)

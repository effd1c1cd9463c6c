"""The guard: the in-process side of steadytune, inside the user's training process.

It does only what needs tensors and must happen *now*: the NaN/Inf check before
the optimizer step, step records with batch fingerprints, heartbeats, and
reading control requests at step boundaries. It appends to its own per-rank
stream and never waits on the supervisor.

Use it from any loop::

    guard = Guard("runs/my-run")
    for step, batch in enumerate(loader, 1):
        guard.begin_step()
        loss = model(**batch).loss
        loss.backward()
        guard.add_microbatch(loss, tokens=int(batch["attention_mask"].sum()), sample_ids=batch_ids)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the norm before clipping
        if guard.before_update(model, optimizer, grad_norm=norm):   # False: non-finite, update skipped
            optimizer.step()
        optimizer.zero_grad()
        guard.end_step(step)
    guard.close()

Without ``grad_norm`` the guard takes the norm of the gradients as they are when
``before_update`` runs: call it before clipping then, or the record shows the
clipped norm and hides every spike behind ``max_norm``.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from steadytune.protocol import RequestQueue, WorkerEvent
from steadytune.records import BatchFingerprint, Event, EventKind, Heartbeat, Severity, StepRecord, WorkerExit
from steadytune.rundir import RunDir
from steadytune.telemetry.segments import segment_bytes_from_env
from steadytune.telemetry.stream import JsonlWriter


def _rank_from_env() -> int:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def _attempt_of(request: dict[str, Any], default: int) -> float:
    try:
        return float(request.get("attempt", default))
    except (TypeError, ValueError):
        return default


def _as_float(x: Any) -> float | None:
    if x is None:
        return None
    try:
        # .item() reads any dtype as a Python number: one call, where detach().float() made three.
        return float(x.item()) if hasattr(x, "item") else float(x)
    except (TypeError, ValueError):
        return None


class Guard:
    """Records every optimizer step and keeps non-finite updates out of the weights.

    Args:
        run_dir: the run directory (``runs/<id>``); created if missing.
        rank: this process's rank; defaults to ``$RANK``.
        attempt: the (re)start number, written into every record.
        nan_guard: skip the optimizer step when the loss or grad norm is non-finite.
        clock: injected for tests.
        segment_bytes: rotate the stream past this size (0: never); defaults to what the
            supervisor hands its worker (``$STEADYTUNE_SEGMENT_BYTES``, ``run.telemetry_segment_bytes``).
    """

    def __init__(
        self,
        run_dir: str | Path,
        rank: int | None = None,
        attempt: int | None = None,
        nan_guard: bool = True,
        clock: Callable[[], float] = time.time,
        segment_bytes: int | None = None,
    ) -> None:
        self.run = RunDir(Path(run_dir)).create()
        self.rank = _rank_from_env() if rank is None else rank
        self.attempt = int(os.environ.get("STEADYTUNE_ATTEMPT", "0")) if attempt is None else attempt
        self.nan_guard = nan_guard
        self.clock = clock
        if segment_bytes is None:
            segment_bytes = segment_bytes_from_env()
        self.writer = JsonlWriter(self.run.telemetry(self.rank), segment_bytes)
        self.skipped_total = 0
        self.consecutive_skips = 0
        self._requests = RequestQueue(self.run.control)
        self._pending: list[dict[str, Any]] = []
        self._reset_step()
        self.last_step = 0
        self.steps_this_attempt = 0
        self.phase = "setup"
        self._beating: threading.Event | None = None
        self._watching: threading.Event | None = None
        self._control_flag = threading.Event()
        self._tick = threading.Event()
        self._rss: int | None = None

    def begin_attempt(self, attempt: int) -> None:
        """Go on as ``attempt`` in this same process (an in-process rollback): every record from now
        carries it, and the attempt's step count starts again."""
        self.attempt = attempt
        self.steps_this_attempt = 0
        self.consecutive_skips = 0
        self._reset_step()
        self.set_phase("setup")

    # -- per optimizer step ------------------------------------------------
    def _reset_step(self) -> None:
        self._t0: float | None = None
        self._loss_sum = 0.0
        self._loss_seen = False
        self._loss_nonfinite = False
        self._tokens = 0
        self._samples = 0
        self._ids: list[int] = []
        self._hashes: list[str] = []
        self._grad_norm: float | None = None
        self._pending_norm: Any = None  # a float, or the framework's tensor until it is read
        self._lr: float | None = None
        self._skipped = False

    def begin_step(self) -> None:
        self._reset_step()
        self._t0 = self.clock()

    def add_microbatch(
        self,
        loss: Any = None,
        tokens: int | None = None,
        sample_ids: Sequence[int] | None = None,
        sample_hashes: Sequence[int | str] | None = None,
    ) -> None:
        """Account one forward/backward of the current optimizer step."""
        if self._t0 is None:
            self._t0 = self.clock()
        value = _as_float(loss)
        if value is not None:
            self._loss_seen = True
            if math.isfinite(value):
                self._loss_sum += value
            else:
                self._loss_nonfinite = True
        if tokens is not None:
            self._tokens += int(tokens)
        if sample_ids is not None:
            ids = [int(i) for i in sample_ids]
            self._ids.extend(ids)
            self._samples += len(ids)
        if sample_hashes is not None:
            hashes = [h if isinstance(h, str) else f"{int(h):015x}" for h in sample_hashes]
            self._hashes.extend(hashes)
            if sample_ids is None:
                self._samples += len(hashes)

    def grad_norm(self, model: Any) -> float:
        """Total L2 norm of the gradients (non-finite if any gradient is)."""
        import torch

        norms = [p.grad.detach().float().norm(2) for p in model.parameters() if p.grad is not None]
        if not norms:
            return 0.0
        return float(torch.linalg.vector_norm(torch.stack(norms), 2).item())

    def observe_grad_norm(self, norm: Any) -> None:
        """The total norm the framework computed while clipping (before clipping scaled the
        gradients): recorded instead of a second pass over already-clipped gradients.
        A tensor is kept as it is and read on the host only when the step needs it.
        """
        self._pending_norm = norm

    def observed_grad_norm(self) -> float | None:
        """The norm passed to :meth:`observe_grad_norm` this step, as a float (None if none was)."""
        if self._pending_norm is not None and not isinstance(self._pending_norm, float):
            self._pending_norm = _as_float(self._pending_norm)
        return self._pending_norm

    def before_update(self, model: Any, optimizer: Any = None, grad_norm: Any = None) -> bool:
        """Decide whether the optimizer may step. On a non-finite loss or gradient,
        drop the gradients so the step leaves the weights bit-identical, and return False.

        ``grad_norm`` (a float or a 0-d tensor, e.g. what ``clip_grad_norm_`` returned) is the
        norm to record; without it, the one observed this step, else the gradients' own.
        """
        if optimizer is not None and getattr(optimizer, "param_groups", None):
            # Per-group LRs (train.lr_groups) carry their factor: record the run's base LR as scheduled.
            first = optimizer.param_groups[0]
            self._lr = float(first["lr"]) / float(first.get("lr_factor", 1.0))
        # Reading the norm on the host is a device sync, but one the NaN guard cannot do without:
        # it must decide before optimizer.step() whether the update may touch the weights.
        norm = _as_float(grad_norm) if grad_norm is not None else self.observed_grad_norm()
        if norm is None:
            norm = self.grad_norm(model)
        self._grad_norm = norm
        bad = self._loss_nonfinite or not math.isfinite(norm)
        if bad and self.nan_guard:
            # set_to_none makes torch optimizers skip these parameters entirely.
            model.zero_grad(set_to_none=True)
            self._skipped = True
            self.skipped_total += 1
            self.consecutive_skips += 1
            return False
        self.consecutive_skips = 0
        return True

    def end_step(
        self,
        step: int,
        loss: Any = None,
        lr: float | None = None,
        epoch: float | None = None,
        extra: dict[str, Any] | None = None,
        ended_at: float | None = None,
    ) -> StepRecord:
        """Write the step record and a heartbeat for optimizer step ``step``.

        ``ended_at`` is when the step ended, for a record written later than that (at the trainer's log
        of the step, whose fields it carries); by default, now.
        """
        now = self.clock() if ended_at is None else ended_at
        if loss is not None:
            value = _as_float(loss)
        elif self._loss_nonfinite:
            value = math.nan
        else:
            value = self._loss_sum if self._loss_seen else None
        record = StepRecord(
            step=step,
            ts=now,
            rank=self.rank,
            attempt=self.attempt,
            loss=value,
            grad_norm=self._grad_norm,
            lr=lr if lr is not None else self._lr,
            tokens=self._tokens or None,
            samples=self._samples or None,
            step_time_s=(now - self._t0) if self._t0 is not None else None,
            epoch=epoch,
            skipped=self._skipped,
            # Hashes without row ids: a trainer that is not ours tells what it trained on, not where from.
            batch=BatchFingerprint(tuple(self._ids), tuple(self._hashes))
            if self._ids or self._hashes
            else None,
            extra=extra or {},
            rss_bytes=self._rss if self._watching is not None else rss_bytes(),
            **device_memory_stats(),
        )
        self.writer.write(record)
        if self._watching is not None:
            self._tick.set()
        self.last_step = step
        self.steps_this_attempt += 1
        self._reset_step()
        return record

    def record_eval(self, step: int, eval_loss: float) -> None:
        self.writer.write(
            StepRecord(
                step=step,
                ts=self.clock(),
                rank=self.rank,
                attempt=self.attempt,
                eval_loss=float(eval_loss),
                extra={"eval": True},
            )
        )

    def heartbeat(self, step: int | None = None, phase: str | None = None) -> None:
        self.writer.write(
            Heartbeat(
                ts=self.clock(),
                rank=self.rank,
                step=self.last_step if step is None else step,
                pid=os.getpid(),
                attempt=self.attempt,
                phase=phase or self.phase,
            )
        )

    def set_phase(self, phase: str) -> None:
        """``setup``/``save``/``eval`` are slow but alive; ``train`` proves life step by step."""
        self.phase = phase
        self.heartbeat()

    def start_heartbeats(self, interval_s: float = 5.0) -> None:
        """Beat from a thread while outside the step loop (loading, saving, evaluating).

        In the ``train`` phase only the loop itself beats, so a loop that hangs goes
        silent and the supervisor can call it a hang.
        """
        if self._beating is not None:
            return
        stop = self._beating = threading.Event()

        def beat() -> None:
            while not stop.wait(interval_s):
                if self.phase != "train":
                    self.heartbeat()

        threading.Thread(target=beat, name="steadytune-heartbeat", daemon=True).start()

    def watch(self, interval_s: float = 0.05) -> None:
        """Read RSS and look for control requests from a thread, off the step loop.

        Both are system calls, and a system call right after a training step's compute runs
        cold (tens of µs, not one). The thread wakes at each step end (and every
        ``interval_s`` between, for slow steps and holds) and does both while the next step
        computes. A step record then carries the RSS read just after the step before it,
        and :meth:`poll_control` reads the queue only once the thread has seen a new file
        in it: a request is acted on one step boundary later than before at most. Idempotent.
        """
        if self._watching is not None:
            return
        stop = self._watching = threading.Event()
        self._rss = rss_bytes()
        self._control_flag.set()  # requests queued before the watch are read at the first boundary
        control = self.run.control

        def look() -> None:
            seen: set[str] = set()
            tick = self._tick
            while True:
                tick.wait(interval_s)
                tick.clear()
                if stop.is_set():
                    return
                self._rss = rss_bytes()
                try:
                    names = set(os.listdir(control))
                except OSError:
                    continue
                if names - seen:
                    self._control_flag.set()
                seen = names

        threading.Thread(target=look, name="steadytune-watch", daemon=True).start()

    def notify(
        self,
        kind: EventKind,
        name: WorkerEvent | str,
        message: str = "",
        severity: Severity = "info",
        step: int | None = None,
        **data: Any,
    ) -> None:
        """Tell the supervisor something happened here (it files it in ``events.jsonl``)."""
        self.writer.write(
            Event(
                ts=self.clock(),
                kind=kind,
                name=str(name),
                message=message,
                severity=severity,
                step=self.last_step if step is None else step,
                data={"rank": self.rank, "attempt": self.attempt, **data},
            )
        )

    # -- control channel ---------------------------------------------------
    def poll_control(self, fresh: bool = False) -> dict[str, Any] | None:
        """The next request from the supervisor or an operator, oldest first; None if there is none.

        Each request is returned once. One sent for an earlier attempt is dropped: it was meant
        for a worker that is gone. ``fresh``: read the queue now, whether or not the watch has seen a
        new file in it yet (after a boundary held for an outside actor, whose request is for it).
        """
        if not self._pending:
            if self._watching is not None and not fresh:
                if not self._control_flag.is_set():
                    return None
                self._control_flag.clear()  # before reading: a file that lands meanwhile sets it again
            self._pending = [r for r in self._requests.new() if _attempt_of(r, self.attempt) >= self.attempt]
        return self._pending.pop(0) if self._pending else None

    def put_back(self, requests: Sequence[dict[str, Any]]) -> None:
        """Return ``requests`` (in their order) from the next polls, before anything newer."""
        self._pending[:0] = list(requests)

    def close(self, status: str = "completed", error: BaseException | None = None, **fields: Any) -> None:
        """Write the worker's last words and close the stream."""
        if self._beating is not None:
            self._beating.set()
        if self._watching is not None:
            self._watching.set()
            self._tick.set()
        self.writer.write(
            WorkerExit(
                ts=self.clock(),
                rank=self.rank,
                attempt=self.attempt,
                step=self.last_step,
                status=status,  # type: ignore[arg-type]
                error_type=type(error).__name__ if error else None,
                error_message=str(error)[:2000] if error else None,
                **fields,
            )
        )
        self.writer.sync()
        self.writer.close()


_PROCESS: Any = None
_STATM: tuple[int, int] | None = None  # (pid, fd of /proc/<pid>/statm), kept open: read every step
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# Whether torch sees CUDA: asked once, not at every step. A forked child asks again (its CUDA state is
# its own); forgetting at fork spares the step an os.getpid(), a system call that costs 10-20 µs right
# after the step's compute.
_CUDA: dict[str, bool] = {}
os.register_at_fork(after_in_child=_CUDA.clear)


def _this_process() -> Any:
    """One psutil handle per process, for systems without ``/proc``."""
    global _PROCESS
    import psutil

    if _PROCESS is None or _PROCESS.pid != os.getpid():
        _PROCESS = psutil.Process()
    return _PROCESS


def rss_bytes() -> int | None:
    """This process's resident memory: one ``pread`` of ``/proc/<pid>/statm`` (under 1 µs,
    psutil's reading costs several), else psutil's; None if neither can tell.
    """
    global _STATM
    pid = os.getpid()
    try:
        if _STATM is None or _STATM[0] != pid:  # a forked child must not read its parent's file
            _STATM = (pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
        return int(os.pread(_STATM[1], 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        return int(_this_process().memory_info().rss)
    except Exception:
        return None


def _cuda_available(torch: Any) -> bool:
    seen = _CUDA.get("available")
    if seen is None:
        seen = _CUDA["available"] = bool(torch.cuda.is_available())
    return seen


def memory_stats() -> dict[str, int | None]:
    """Device memory (CUDA when present) and process RSS; unavailable readings are None."""
    return {"rss_bytes": rss_bytes(), **device_memory_stats()}


def device_memory_stats() -> dict[str, int | None]:
    """CUDA allocated, reserved and peak bytes; empty without CUDA (or without torch loaded)."""
    stats: dict[str, int | None] = {}
    torch = sys.modules.get("torch")  # a loop without torch has no device memory to read
    if torch is None:
        return stats
    try:
        if _cuda_available(torch):
            stats["mem_allocated_bytes"] = torch.cuda.memory_allocated()
            stats["mem_reserved_bytes"] = torch.cuda.memory_reserved()
            stats["mem_peak_bytes"] = torch.cuda.max_memory_allocated()
    except Exception:
        pass
    return stats

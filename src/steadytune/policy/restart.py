"""What to do when a worker exits: pure classification and restart decisions.

The supervisor gathers the facts (exit code, signal, the worker's last record,
the tail of its stderr) into an :class:`ExitInfo`; this module says what it was
and whether to restart, after how long, or to stop and explain.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass

# Messages that identify a crash's cause, checked in order against the stderr tail.
_CLASSIFIERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "oom",
        re.compile(
            r"CUDA out of memory|OutOfMemoryError|HIP out of memory|DefaultCPUAllocator: can't allocate "
            r"memory"
            r"|CUBLAS_STATUS_ALLOC_FAILED|cuDNN error: CUDNN_STATUS_NOT_SUPPORTED|SplitExhausted",
            re.I,
        ),
    ),
    (
        "collective_timeout",
        re.compile(
            r"NCCL.*(timeout|Timeout|watchdog)|Watchdog caught collective operation "
            r"timeout|ProcessGroupGloo.*timed? ?out|Connection closed by peer|gloo.*Timed out",
            re.I,
        ),
    ),
    (
        "cuda_error",
        re.compile(
            r"CUDA error|cudaError|device-side assert|illegal memory access|CUBLAS_STATUS|cuDNN "
            r"error|NCCL error",
            re.I,
        ),
    ),
    # A launcher that reports its trainer's SIGKILL in words (the job itself exits 1): accelerate's
    # CalledProcessError "died with <Signals.SIGKILL: 9>" (axolotl, TRL), subprocess's "non-zero exit
    # status -9", torch elastic's ChildFailedError "Signal 9 (SIGKILL) received by PID".
    (
        "killed",
        re.compile(
            r"died with <Signals\.SIGKILL: 9>|non-zero exit status -9\b|Signal 9 \(SIGKILL\) received"
        ),
    ),
)


_MAX_SIGNAL = 64  # Linux's real-time signals end at 64


def is_oom_message(text: str) -> bool:
    """Whether an error text is an out-of-memory error (the table above, shared with the worker)."""
    return bool(_CLASSIFIERS[0][1].search(text))


@dataclass(frozen=True)
class ExitInfo:
    """The facts of one worker exit."""

    returncode: int | None
    status: str | None = None  # the worker's own last word: completed / stopped / paused / error
    error_type: str | None = None
    error_message: str | None = None
    step: int = 0
    deterministic: bool = False
    stderr_tail: str = ""
    interrupted: bool = False  # the supervisor itself asked it to stop (Ctrl-C, SIGTERM, operator)
    hung: bool = False  # the supervisor killed it for not making progress
    stopped_outside: bool = False  # the supervisor ended it for a stop or pause: ``status`` is its word
    where: str | None = None  # the rank a multi-rank job lost first: "rank 1 (local rank 1, pid 9531)"

    @property
    def signal(self) -> int | None:
        rc = self.returncode
        if rc is not None and rc < 0:
            return -rc
        if rc is not None and rc > 128 and not self.status:
            if rc - 128 <= _MAX_SIGNAL:
                return rc - 128  # shells and torchrun report a signal death as 128 + signo
            # A Python launcher that passes its child's returncode on (`sys.exit(proc.returncode)`, as
            # `swift sft` does) exits with -signo modulo 256: SIGKILL is 247.
            return 256 - rc
        return None


@dataclass(frozen=True)
class Decision:
    action: str  # "done" | "restart" | "stop"
    classification: str
    reason: str
    delay_s: float = 0.0


def classify(info: ExitInfo) -> str:
    """One word for how the worker ended."""
    if info.status in {"completed", "stopped", "paused"} and (
        info.returncode in (0, None) or info.stopped_outside
    ):
        return info.status
    if info.interrupted:
        return "user_interrupt"
    if info.hung:
        return "hang"
    text = f"{info.error_type or ''} {info.error_message or ''}\n{info.stderr_tail}"
    for name, pattern in _CLASSIFIERS:
        if pattern.search(text):
            return name
    sig = info.signal
    if sig == _signal.SIGKILL and not info.error_type:
        # SIGKILL with no last words: the kernel OOM killer, or someone's kill -9.
        return "killed"
    if sig is not None:
        return (
            f"signal_{_signal.Signals(sig).name}"
            if sig in _signal.Signals._value2member_map_
            else f"signal_{sig}"
        )
    if info.error_type:
        return "python_error"
    return "exit_nonzero"


def exit_words(info: ExitInfo) -> str:
    """How a worker that left no Python error ended: its exit code or its signal.

    A supervised command (``sh``, a launcher) that failed with ``exit 3`` read "error before the
    first step", its code nowhere in the run: the first thing its author needs.
    """
    sig = info.signal
    if sig is not None:
        name = _signal.Signals(sig).name if sig in _signal.Signals._value2member_map_ else f"signal {sig}"
        return f"the worker was killed by {name}"
    if info.returncode:
        return f"the worker exited with code {info.returncode}"
    return "error"


def backoff(restarts_used: int, base_s: float, max_s: float) -> float:
    """Exponential backoff: base, 2·base, 4·base, ... capped at ``max_s``."""
    return min(max_s, base_s * (2**restarts_used)) if base_s > 0 else 0.0


def decide(
    info: ExitInfo,
    previous: list[ExitInfo],
    restarts_used: int,
    max_restarts: int,
    backoff_s: float = 1.0,
    backoff_max_s: float = 60.0,
) -> Decision:
    """Restart, stop or finish, given this exit and the earlier ones of the same run."""
    kind = classify(info)
    if kind in {"completed", "stopped", "paused"}:
        return Decision("done", kind, f"worker {kind} at step {info.step}")
    if kind == "user_interrupt":
        return Decision("stop", kind, "stopped on request")
    if info.deterministic:
        return Decision(
            "stop",
            "deterministic",
            f"{info.error_type or exit_words(info)} before the first step of the attempt: "
            f"{info.error_message or 'see the worker log'}; "
            "a restart would fail the same way, so fix the input and run again",
        )
    repeat = [p for p in previous if p.error_type and p.error_type == info.error_type and p.step == info.step]
    if info.error_type and repeat:
        return Decision(
            "stop",
            "deterministic",
            f"{info.error_type} at step {info.step} twice in a row: {info.error_message or ''}; "
            "this is not transient, so steadytune stops instead of looping",
        )
    on = f" on {info.where}" if info.where else ""
    if restarts_used >= max_restarts:
        return Decision("stop", kind, f"{kind}{on} and the restart budget ({max_restarts}) is spent")
    return Decision(
        "restart",
        kind,
        f"{kind}{on} at step {info.step}; restart {restarts_used + 1}/{max_restarts}",
        backoff(restarts_used, backoff_s, backoff_max_s),
    )

"""The drill's catalogue of faults: how each is injected and what recovery looks like.

In-worker faults go through ``$STEADYTUNE_FAULTS`` (see :mod:`steadytune.guard.faults`);
external ones (kill, corruption) are done to the worker by an actor thread, as an
operator or the kernel would.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

# Drill runs are short: hangs must be called in seconds, not the production minute.
DRILL_OVERRIDES: dict[str, Any] = {
    "detect": {"pace": {"hang_floor_s": 8.0, "stall_min_s": 8.0}},
    "policy": {"spike_confirm_points": 2},
    "run": {"restart_backoff_s": 0.5, "keep_last": 10, "good_window_steps": 5},
    "alerts": {"enabled": False},  # the drill reports for itself; nobody should be paged
}


@dataclass(frozen=True)
class FaultSpec:
    """One fault of the drill."""

    kind: str
    at_step: int
    env: dict[str, Any] = field(default_factory=dict)  # $STEADYTUNE_FAULTS
    actor: str | None = None  # "kill", "kill_during_save", "corrupt_then_kill"; see drill.external for more
    detect: tuple[str, ...] = ()  # event names that count as detecting it
    act: tuple[str, ...] = ()  # action event names that count as the response
    in_process: bool = False  # recovered without restarting the worker
    # The event kinds the response may have: a clean stop is a lifecycle event, not an action.
    act_kinds: tuple[str, ...] = ("action",)
    expect_state: str = "completed"  # the run's end state that counts as recovered
    # The worker's event that says the fault landed; without one filed the fault was not injected and
    # nothing was proven. Empty: the fault's landing is seen otherwise (an actor's, the telemetry's).
    fires: tuple[str, ...] = ()


def catalogue(save_steps: int) -> dict[str, FaultSpec]:
    """The default faults, placed relative to the checkpoint interval."""
    s = save_steps
    return {
        "nan": FaultSpec(
            "nan",
            2 * s + s // 2,
            {"nan_at_step": 2 * s + s // 2},
            detect=("nan_loss", "skip_step"),
            act=("skip_step",),
            in_process=True,
            fires=("fault_injected",),
        ),
        "oom": FaultSpec(
            "oom",
            2 * s + s // 2,
            {"oom_at_step": 2 * s + s // 2, "oom_above": 4},
            detect=("reduce_microbatch",),
            act=("reduce_microbatch",),
            in_process=True,
        ),
        "spike": FaultSpec(
            "spike",
            3 * s + 1,
            {"lr_burst_at_step": 3 * s + 1, "lr_burst_factor": 1000.0, "lr_burst_steps": 3},
            detect=("loss_spike", "divergence", "grad_explosion", "grad_spike"),
            act=("rollback",),
        ),
        "kill": FaultSpec(
            "kill",
            3 * s + s // 2,
            # The worker waits at the step, so the kill lands on it however late the supervisor reads.
            {"step_sleep_s": 0.02, "hold_at_step": 3 * s + s // 2, "hold_s": 30.0},
            actor="kill",
            detect=("restart",),
            act=("restart",),
        ),
        "kill-during-save": FaultSpec(
            "kill-during-save",
            4 * s,
            {"slow_save_s": 30.0, "slow_save_step": 4 * s},
            actor="kill_during_save",
            detect=("restart",),
            act=("restart",),
        ),
        "hang": FaultSpec(
            "hang", 3 * s + s // 2, {"hang_at_step": 3 * s + s // 2}, detect=("stall",), act=("restart",)
        ),
        "corrupt-checkpoint": FaultSpec(
            "corrupt-checkpoint",
            3 * s,
            {"step_sleep_s": 0.02},
            actor="corrupt_then_kill",
            detect=("checkpoint_corrupt",),
            act=("restart",),
        ),
    }


def parse_inject(spec: str, save_steps: int, known: dict[str, FaultSpec] | None = None) -> list[FaultSpec]:
    """``nan,kill`` or ``spike@61,hang@70``: a list of faults, each at its default or given step.

    ``known`` is the catalogue to choose from (default: the native drill's).
    """
    known = catalogue(save_steps) if known is None else known
    out = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, _, at = part.partition("@")
        if name not in known:
            raise ValueError(f"unknown fault {name!r}; choose from {', '.join(known)}")
        base = known[name]
        if at:
            if not at.isdigit():
                raise ValueError(f"fault {part!r}: the step after @ must be a whole number, e.g. {name}@30")
            step = int(at)
            env = {
                k: (step if k.endswith("_at_step") or k == "slow_save_step" else v)
                for k, v in base.env.items()
            }
            base = replace(base, at_step=step, env=env)
        out.append(base)
    return out


def placement_problem(
    faults: list[FaultSpec], last_step: int, last_from: str, save_steps: int, save_from: str, more: str
) -> str | None:
    """Why faults placed at or past the run's last step cannot be drilled; None when all fall inside it.

    Such a fault never fires, so its run would prove nothing. ``last_from``/``save_from`` say where
    the last step and the checkpoint interval were read, ``more`` how to give the run more steps.
    """
    late = [f for f in faults if f.at_step >= last_step]
    if not late:
        return None
    return (
        f"the run ends at step {last_step} ({last_from}), at or before fault(s) "
        f"{', '.join(f'{f.kind}@{f.at_step}' for f in late)}, placed from save_steps {save_steps} "
        f"({save_from}): nothing would be injected. Give a smaller --save-steps (the faults sit at 2 to 4 "
        f"times it), {more}, or place each with @STEP (e.g. {late[0].kind}@{max(1, last_step // 2)})"
    )

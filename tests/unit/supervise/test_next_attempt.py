"""The restart planner: budgets, backoff, the repeat rule, the smaller micro-batch and plan revisions."""

from __future__ import annotations

from typing import Any

from steadytune.config.schema import RunConfig, TrainConfig
from steadytune.policy.restart import ExitInfo
from steadytune.records import PlanRevision
from steadytune.supervise.next_attempt import NextAttempt, RestartPlanner

KILLED = ExitInfo(returncode=-9, step=5)  # no last words: the kernel's OOM killer or a kill -9


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def planner(
    max_restarts: int = 3, batch: int | str = 8, accum: int = 2, clock: Clock | None = None
) -> RestartPlanner:
    run = RunConfig(max_restarts=max_restarts, restart_backoff_s=1.0, restart_backoff_max_s=3.0)
    train = TrainConfig(per_device_train_batch_size=batch, gradient_accumulation_steps=accum)
    return RestartPlanner(run, train, clock or Clock())


def plan(**fields: Any) -> PlanRevision:
    return PlanRevision(revision=0, ts=0.0, reason="start", attempt=0, **fields)


def crash(p: RestartPlanner, info: ExitInfo = KILLED) -> tuple[str, float]:
    """One crash: the decision, and where it restarts, the restart counted."""
    d = p.decide(info)
    if d.action == "restart":
        p.after_crash(plan(), {"resume_checkpoint": None}, d.classification, d.reason, d.delay_s)
    return d.action, d.delay_s


def test_crash_restarts_back_off_doubling_to_the_cap_and_stop_when_the_budget_is_spent() -> None:
    p = planner(max_restarts=4)
    assert [crash(p) for _ in range(5)] == [
        ("restart", 1.0),
        ("restart", 2.0),
        ("restart", 3.0),
        ("restart", 3.0),
        ("stop", 0.0),
    ]
    assert p.restarts == 4 and not p.budget_left()
    assert p.decide(KILLED).reason == "killed and the restart budget (4) is spent"


def test_a_budget_of_none_stops_at_the_first_crash() -> None:
    p = planner(max_restarts=0)
    assert not p.budget_left()
    assert crash(p) == ("stop", 0.0)


def test_restarts_the_policy_asked_for_spend_no_crash_budget_and_never_wait() -> None:
    p = planner(max_restarts=1)
    nxt = [
        p.after_action(plan(), {"resume_checkpoint": "c-10"}, "loss_spike", "rolled back") for _ in range(3)
    ]
    assert {n.delay_s for n in nxt} == {0.0}
    assert p.budget_left() and (p.action_restarts, p.restarts, p.total) == (3, 0, 3)
    assert crash(p) == ("restart", 1.0)  # the first crash backs off from the start
    assert p.total == 4 and not p.budget_left()


def test_the_same_error_at_the_same_step_twice_stops_with_budget_left() -> None:
    p = planner(max_restarts=5)
    boom = ExitInfo(returncode=1, step=12, error_type="ValueError", error_message="bad row")
    assert crash(p, boom) == ("restart", 1.0)
    d = p.decide(boom)
    assert (d.action, d.classification) == ("stop", "deterministic")
    assert "ValueError at step 12 twice in a row" in d.reason
    # The same error at another step is not a repeat.
    assert p.decide(ExitInfo(returncode=1, step=13, error_type="ValueError")).action == "restart"


def test_a_memory_warning_halves_the_micro_batch_of_the_next_restart_only() -> None:
    p = planner(batch=8, accum=2)
    p.shrink_next = True
    first = p.after_crash(plan(), {"resume_checkpoint": "c-20"}, "oom", "oom at step 21", 2.0)
    assert first.changes == {
        "resume_checkpoint": "c-20",
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 4,
    }
    assert first.why == "oom at step 21; micro-batch 4 x accumulation 4 (same effective batch)"
    assert first.delay_s == 2.0 and not p.shrink_next
    second = p.after_action(plan(), {"resume_checkpoint": "c-20"}, "hang", "hang")
    assert second == NextAttempt({"resume_checkpoint": "c-20"}, "hang", "hang")


def test_the_micro_batch_shrinks_from_what_the_plan_runs_and_not_below_one() -> None:
    p = planner(batch=8, accum=2)
    p.shrink_next = True
    nxt = p.after_action(plan(per_device_train_batch_size=6, gradient_accumulation_steps=3), {}, "leak", "l")
    assert nxt.changes == {"per_device_train_batch_size": 3, "gradient_accumulation_steps": 6}
    p.shrink_next = True
    one = p.after_action(plan(per_device_train_batch_size=1), {}, "leak", "leak")
    assert one == NextAttempt({}, "leak", "leak") and not p.shrink_next


def test_an_auto_micro_batch_is_the_one_the_plan_found() -> None:
    p = planner(batch="auto")
    assert p.batch(plan()) == 1
    assert p.batch(plan(per_device_train_batch_size=16)) == 16
    assert planner(batch=8).batch(plan(per_device_train_batch_size=16)) == 8


def test_a_revision_counts_on_stamps_the_injected_clock_and_inherits_the_rest() -> None:
    clock = Clock(1234.5)
    p = planner(clock=clock)
    base = plan(lr_scale=0.5, resume_checkpoint="c-10", notes="start")
    nxt = p.revision(base, "killed", 7, attempt=1, resume_checkpoint="c-20")
    assert (nxt.revision, nxt.ts, nxt.reason, nxt.cause_event_seq) == (1, 1234.5, "killed", 7)
    assert (nxt.attempt, nxt.resume_checkpoint, nxt.lr_scale, nxt.notes) == (1, "c-20", 0.5, "start")
    clock.t = 2000.0
    again = p.revision(nxt, "resume", None)
    assert (again.revision, again.ts, again.cause_event_seq, again.resume_checkpoint) == (
        2,
        2000.0,
        None,
        "c-20",
    )


def test_the_restart_event_says_the_wait_and_shows_only_what_the_plan_sets() -> None:
    nxt = NextAttempt(
        {"resume_checkpoint": "c-20", "lr_scale": None, "skip_steps": [3]}, "killed", "kill", 4.0
    )
    assert nxt.message("worker") == "restarting the worker: kill in 4s"
    assert nxt.event_data(-9) == {"classification": "killed", "returncode": -9, "resume_checkpoint": "c-20"}
    assert NextAttempt({}, "hang", "hang").message("job") == "restarting the job: hang"

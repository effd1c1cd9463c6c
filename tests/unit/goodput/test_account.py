"""The goodput account on constructed run histories: every part is the seconds the construction meant."""

from __future__ import annotations

import pytest

from steadytune.goodput.account import account, interruption_record
from steadytune.goodput.parts import PARTS, PRODUCTIVE, Account

from .history import Run


def assert_parts(acct: Account, run: Run) -> None:
    """Each part is what the builder tallied for it, and together they are the wall time."""
    got = {p: round(acct.seconds[p], 9) for p in PARTS if acct.seconds[p]}
    want = {p: round(s, 9) for p, s in run.want.items() if s}
    assert got == want
    assert acct.wall_s == pytest.approx(run.wall)
    assert sum(acct.seconds.values()) == pytest.approx(acct.wall_s)


def started(run: Run, **launch: object) -> Run:
    run.plan(0, "start")
    return run.event("run_started", **({"launch": launch} if launch else {}))


def steps(run: Run, attempt: int, first: int, last: int, save_every: int = 0, part: str = PRODUCTIVE) -> Run:
    for n in range(first, last + 1):
        run.step(n, attempt, 1.0, part)
        if save_every and n % save_every == 0:
            run.save(attempt)
    return run


def finished(run: Run, attempt: int, state: str = "completed") -> Run:
    run.exit(attempt, "completed" if state == "completed" else "stopped")
    return run.spend("shutdown", 1.5).event(f"run_{state}")


def test_a_clean_run_is_start_up_steps_saves_an_evaluation_and_shut_down() -> None:
    run = started(Run()).spend("startup", 0.5)
    run.launch(0, "startup").spend("startup", 0.25)  # the loop's own set-up before its first step
    steps(run, 0, 1, 9, save_every=5)
    run.step(10, 0)
    run.beat("eval", 0).spend("eval", 2.0).eval_record(10, 0).beat("save", 0).spend("save", 0.7).beat(
        "train", 0
    )
    run.spend("shutdown", 0.2)  # the trainer winding down after its last save
    acct = account(finished(run, 0).history())
    assert_parts(acct, run)
    assert (acct.steps_kept, acct.steps_redone, acct.saves, acct.interruptions) == (10, 0, 2, 0)
    assert acct.goodput == pytest.approx(10.0 / run.wall)
    assert acct.save_cost_s == pytest.approx((0.5 + 0.7) / 2)
    assert acct.state == "completed" and acct.ended


def test_a_crash_loses_the_steps_after_the_checkpoint_and_the_restart() -> None:
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 5, save_every=5)
    steps(run, 0, 6, 7, part="redone")  # trained again by the next attempt
    run.spend("redone", 0.4)  # step 8 under way when the worker was killed (no last words)
    run.event("restart", "action", classification="killed", returncode=-9)
    run.spend("restart", 0.5).plan(1, "killed", resume=5).event("worker_started")
    run.launch(1, "restart", load_s=3.0, resume=5)
    steps(run, 1, 6, 10)
    acct = account(finished(run, 1).history())
    assert_parts(acct, run)
    assert (acct.steps_kept, acct.steps_redone, acct.interruptions) == (10, 2, 1)


def test_an_error_exit_ends_the_attempt_at_its_last_words() -> None:
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 4, save_every=2)
    run.spend("redone", 0.3).exit(0, "error")  # the step under way raised
    run.spend("restart", 0.2).event("restart", "action", classification="python_error")
    run.spend("restart", 1.0).plan(1, "python_error", resume=4).launch(1, "restart", resume=4)
    steps(run, 1, 5, 6)
    assert_parts(account(finished(run, 1).history()), run)


def test_a_rollback_in_the_running_worker_is_in_process_recovery() -> None:
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 4, save_every=4)
    steps(run, 0, 5, 7, part="redone")  # the spike at 5, and the steps until the worker took the request
    run.event("rollback_in_process", "action").plan(1, "loss_spike", resume=4)
    run.spend("redone", 0.05).worker_event("ack_rollback", 0, kind="control")
    run.spend("recovery", 0.1).beat("setup", 1).spend("recovery", 0.6)
    run.worker_event("train_begin", 1, start_step=4).worker_event("rolled_back", 1).beat("train", 1)
    steps(run, 1, 5, 8)
    acct = account(finished(run, 1).history())
    assert_parts(acct, run)
    assert (acct.steps_redone, acct.interruptions) == (3, 1)


def test_a_hang_is_the_silence_from_the_last_step_to_the_restart() -> None:
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 6, save_every=3)
    run.spend("hang", 15.0).event("stall", "anomaly").spend("hang", 1.0)  # called, stacks dumped
    run.event("restart", "action", classification="stall").spend("restart", 0.1).plan(1, "stall", resume=6)
    run.launch(1, "restart", resume=6)
    steps(run, 1, 7, 8)
    acct = account(finished(run, 1).history())
    assert_parts(acct, run)
    assert acct.interruptions == 1


def test_an_out_of_memory_split_and_a_skipped_update_are_in_process_recovery() -> None:
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 3)
    run.spend("recovery", 0.4).worker_event("reduce_microbatch", 0, kind="action", micro_batch_split=2)
    run.step(4, 0, 0.9, step_time=1.3)  # its step_time_s counts the try that ran out of memory
    run.step(5, 0, 1.0, "recovery", skipped=True)  # the NaN guard dropped the update
    steps(run, 0, 6, 7)
    acct = account(finished(run, 0).history())
    assert_parts(acct, run)
    assert acct.interruptions == 0


def test_an_operator_pause_and_resume_counts_as_pause() -> None:
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 3)
    run.worker_event("ack_pause", 0, kind="control").save(0).spend("pause", 0.2).exit(0, "paused")
    run.spend("pause", 0.3).event("run_paused").spend("pause", 60.0).event("run_resumed")
    run.plan(1, "resume", resume=3).launch(1, "pause", resume=3)
    steps(run, 1, 4, 6)
    acct = account(finished(run, 1).history())
    assert_parts(acct, run)
    assert acct.interruptions == 0  # an operator's resume lost no work


def test_a_run_resumed_after_it_was_stopped_was_not_running_in_between() -> None:
    """The records a stopped (SIGTERM, `steadytune stop`) then `steadytune resume`d run writes: the
    time between was charged as an operator's pause (a weekend's stop: goodput near nothing). The
    run did not run then; nothing held the machine for it."""
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 5)
    run.worker_event("ack_stop", 0, kind="control").save(0).beat("finish", 0).spend("shutdown", 0.1)
    run.exit(0, "stopped").spend("shutdown", 1.5).event("run_stopped")
    run.not_running(3 * 86400.0)
    run.event("run_resumed", after="stopped", attempt=1).plan(1, "resume", resume=5)
    run.spend("startup", 0.4).launch(1, "startup", resume=5)  # a new supervisor: process, model, data
    steps(run, 1, 6, 8)
    acct = account(finished(run, 1).history())
    assert_parts(acct, run)
    assert acct.stopped_s == pytest.approx(3 * 86400.0)
    assert acct.goodput == pytest.approx(8.0 / run.wall)
    assert Account.from_dict(acct.stored()).wall_s == pytest.approx(acct.wall_s)
    assert acct.interruptions == 0  # an operator's resume lost no work
    count, exposure = interruption_record(run.plans, run.events)
    assert (count, exposure) == (0, pytest.approx(acct.exposure_s))


def test_a_pause_held_in_memory_is_its_heartbeats_phase() -> None:
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 2)
    run.beat("paused", 0).spend("pause", 30.0).beat("train", 0)
    steps(run, 0, 3, 4)
    assert_parts(account(finished(run, 0).history()), run)


def test_queue_wait_and_preflight_come_before_start_up() -> None:
    run = Run()
    submitted = run.t
    run.spend("queue", 40.0)
    launched = run.t
    run.spend("startup", 1.0)
    preflight = (run.t, run.t + 6.0)
    run.spend("preflight", 6.0).spend("startup", 0.5)
    started(run, submitted_ts=submitted, launched_ts=launched, preflight=list(preflight)).launch(0, "startup")
    steps(run, 0, 1, 3)
    assert_parts(account(finished(run, 0).history()), run)


def test_a_live_run_ends_at_the_reading_with_the_step_under_way_counted() -> None:
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 3)
    run.spend(PRODUCTIVE, 0.4)  # step 4 under way at the reading
    acct = account(run.history(), now=run.t)
    assert_parts(acct, run)
    assert not acct.ended and acct.state is None


def test_a_live_run_called_stalled_is_hanging_now() -> None:
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 3)
    run.spend("hang", 20.0).event("stall", "anomaly").spend("hang", 2.0)
    assert_parts(account(run.history(), now=run.t), run)


def test_a_run_whose_supervisor_died_ends_at_its_last_record() -> None:
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 3)
    acct = account(run.history())  # no end recorded, no reading time: the account stops at step 3
    assert_parts(acct, run)


def test_a_silence_far_beyond_the_step_is_unattributed() -> None:
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 2)
    # 100 s of training loop for a 1 s step: 4x and 30 s beyond it are the step's; the rest is unexplained.
    run.spend(PRODUCTIVE, 31.0).spend("unattributed", 69.0)
    run.logged(3, 0, step_time=1.0)
    steps(run, 0, 4, 4)
    acct = account(finished(run, 0).history())
    assert acct.seconds["unattributed"] == pytest.approx(69.0)
    assert sum(acct.seconds.values()) == pytest.approx(run.wall)


def test_a_watched_command_logging_every_ten_steps() -> None:
    """The log adapter's first record has no step time: its ten steps take the attempt's own pace."""
    run = started(Run()).spend("startup", 3.0).beat("setup", 0).spend("startup", 5.0)
    run.spend(PRODUCTIVE, 10 * 0.5).logged(10, 0)
    for n in (20, 30):
        run.step(n, 0, 10 * 0.5, step_time=0.5)  # the interval's time per step
    acct = account(finished(run, 0).history())
    assert_parts(acct, run)


def test_a_first_attempt_that_never_trains_is_all_start_up() -> None:
    run = started(Run()).spend("startup", 2.0).beat("setup", 0).spend("startup", 3.0).exit(0, "error")
    run.spend("shutdown", 0.5).event("run_failed")
    acct = account(run.history())
    assert_parts(acct, run)
    assert acct.goodput == 0.0 and acct.state == "failed"


def test_the_budget_spent_on_a_crash_ends_the_run_failed() -> None:
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 3)
    run.spend("redone", 0.5).event("run_failed")  # killed, and no restart left
    acct = account(run.history())
    assert_parts(acct, run)
    assert acct.state == "failed"


def test_the_alert_telling_of_the_end_filed_after_it_is_not_the_end() -> None:
    """The end's alert is filed when its delivery ends (kind alert, the end's own name): the run
    ended before, and as it said."""
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 3)
    finished(run, 0, "stopped")
    ended = run.t
    run.t += 2.0  # the delivery took two seconds
    run.event("run_stopped", "alert", delivered=["console"], status="delivered")
    acct = account(run.history())
    assert acct.wall_s == pytest.approx(ended - run.t0) and acct.state == "stopped"
    assert interruption_record(run.plans, run.events)[1] == pytest.approx(ended - run.t0)


def test_an_empty_history_has_no_time_and_no_goodput() -> None:
    acct = account(Run().history())
    assert acct.wall_s == 0.0 and acct.goodput is None


def test_gpu_seconds_scale_with_the_processes() -> None:
    run = started(Run()).launch(0, "startup")
    steps(run, 0, 1, 2)
    acct = account(finished(run, 0).history(gpus=4))
    assert acct.gpus == 4 and acct.to_dict()["gpus"] == 4


def test_the_interruption_record_from_plans_and_events_is_the_accounts() -> None:
    """check reads many runs' plans and events alone: it must count what the account counts."""
    run = Run()
    preflight = (run.t, run.t + 5.0)
    run.spend("preflight", 5.0).spend("startup", 0.5)
    started(run, launched_ts=run.t0, preflight=list(preflight)).launch(0, "startup")
    steps(run, 0, 1, 4, save_every=2)
    run.spend("redone", 0.3).event("restart", "action", classification="killed").spend("restart", 1.0)
    run.plan(1, "killed", resume=4).launch(1, "restart", resume=4)
    steps(run, 1, 5, 6)
    run.worker_event("ack_pause", 1, kind="control").save(1).exit(1, "paused").spend("pause", 20.0)
    run.plan(2, "resume", resume=6).launch(2, "pause", resume=6)  # an operator's resume: no interruption
    steps(run, 2, 7, 8)
    acct = account(finished(run, 2).history())
    assert_parts(acct, run)
    count, exposure = interruption_record(run.plans, run.events)
    assert (
        (count, exposure)
        == (acct.interruptions, pytest.approx(acct.exposure_s))
        == (1, pytest.approx(run.wall - 5.0))
    )

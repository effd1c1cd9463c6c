"""The supervisor's own decisions, on a real Supervisor object: LAST_GOOD, one action per incident, and the
stop escalation (Ctrl-C twice, a worker that ignores stop) against real processes that ignore SIGTERM."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadytune.checkpoint.store import read_pointer, write_pointer
from steadytune.detect.live import Transition
from steadytune.policy.restart import Decision, ExitInfo, decide
from steadytune.records import Anomaly, StepRecord
from steadytune.supervise.process import WorkerProcess
from steadytune.supervise.supervisor import Supervisor
from steadytune.telemetry.events import read_events
from tests.unit.supervise.build import FakeWorker, checkpoint, step, supervisor
from tests.waiting import wait_for

# -- LAST_GOOD ----------------------------------------------------------------


def test_last_good_waits_for_a_healthy_window_and_skips_a_checkpoint_trouble_followed(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)  # good_window_steps: 3
    checkpoint(sup, 10)
    for n in range(1, 13):
        step(sup, n)
    sup.books.update_last_good()
    assert read_pointer(sup.run.last_good_pointer) is None  # step 12: the window after 10 is not over
    step(sup, 13)
    sup.books.update_last_good()
    assert read_pointer(sup.run.last_good_pointer).name == "checkpoint-10"

    checkpoint(sup, 20)
    sup.state.history.trouble_steps.append(22)  # e.g. a NaN two steps after checkpoint-20
    for n in range(14, 30):
        step(sup, n)
        sup.books.update_last_good()
    assert read_pointer(sup.run.last_good_pointer).name == "checkpoint-10"  # never 20

    checkpoint(sup, 30)
    sup.state.history.trouble_steps.append(
        30
    )  # trouble at the checkpoint's own step came before it: not after
    sup.state.history.trouble_steps.append(34)  # and after the window it says nothing about the checkpoint
    for n in range(30, 34):
        step(sup, n)
    sup.books.update_last_good()
    assert read_pointer(sup.run.last_good_pointer).name == "checkpoint-30"


def test_last_good_is_read_only_when_a_save_is_due(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The turns between two saves' judgements (nearly all of them) read nothing from disk."""
    from steadytune.supervise import status

    reads: list[Path] = []

    def counted(pointer: Path) -> Path | None:
        reads.append(pointer)
        return read_pointer(pointer)

    monkeypatch.setattr(status, "read_pointer", counted)
    sup = supervisor(tmp_path)  # good_window_steps: 3
    checkpoint(sup, 10)
    for n in range(1, 13):
        step(sup, n)
        sup.books.update_last_good()
    assert reads == [] and read_pointer(sup.run.last_good_pointer) is None  # 10's window is not over
    for n in range(13, 20):
        step(sup, n)
        sup.books.update_last_good()
    assert len(reads) == 1 and read_pointer(sup.run.last_good_pointer).name == "checkpoint-10"
    checkpoint(sup, 20)
    sup.state.history.trouble_steps.append(21)
    for n in range(20, 30):
        step(sup, n)
        sup.books.update_last_good()
    assert len(reads) == 2  # 20 judged once, when its window was over
    assert read_pointer(sup.run.last_good_pointer).name == "checkpoint-10"
    checkpoint(sup, 30)
    sup.state.status = "completed"  # the run's end: its last save needs no window
    sup.books.update_last_good()
    sup.books.update_last_good()
    assert len(reads) == 3 and read_pointer(sup.run.last_good_pointer).name == "checkpoint-30"


def test_last_good_on_completion_and_never_a_missing_directory(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    checkpoint(sup, 10)
    sup.state.history.checkpoint_steps.append(
        20
    )  # announced, but its directory is gone (retention, or a torn save)
    for n in range(1, 25):
        step(sup, n)
    sup.books.update_last_good()
    assert read_pointer(sup.run.last_good_pointer).name == "checkpoint-10"
    checkpoint(sup, 25)
    # The run completes at step 25: its last checkpoint needs no window after it.
    sup.finish(
        Decision("done", "completed", "worker completed at step 25"), ExitInfo(0, "completed", step=25), 0.0
    )
    assert read_pointer(sup.run.last_good_pointer).name == "checkpoint-25"


def test_a_save_passed_over_is_judged_again_once_a_rollback_saves_its_step_anew(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    checkpoint(sup, 10)
    sup.state.history.checkpoint_steps.append(20)  # announced, its folder not there: passed over
    for n in range(1, 25):
        step(sup, n)
        sup.books.update_last_good()
    assert read_pointer(sup.run.last_good_pointer).name == "checkpoint-10"
    # A rollback to 10: the steps after it are trained again, and this time checkpoint-20 is whole.
    sup.state.progress.rewind(10, 1)
    sup.state.history.checkpoint_steps = [10]
    for n in range(11, 25):
        if n == 20:
            checkpoint(sup, 20)
        sup.handle(StepRecord(step=n, ts=float(n), loss=1.0, grad_norm=1.0, attempt=1))
        sup.books.update_last_good()
    assert read_pointer(sup.run.last_good_pointer).name == "checkpoint-20"


def test_an_older_pointer_is_not_moved_back(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    checkpoint(sup, 10)
    checkpoint(sup, 20)
    write_pointer(sup.run.last_good_pointer, sup.run.checkpoints / "checkpoint-20")
    for n in range(1, 30):
        step(sup, n)
    sup.books.update_last_good()
    assert read_pointer(sup.run.last_good_pointer).name == "checkpoint-20"


def test_status_names_the_checkpoint_folder_where_it_leads_once_it_is_made(tmp_path: Path) -> None:
    """The folder is resolved once it is there; until then at each write, as the job may make it a link."""
    sup = supervisor(tmp_path)
    elsewhere = tmp_path / "disk2" / "ckpts"
    elsewhere.mkdir(parents=True)
    (tmp_path / "out").mkdir()
    root = sup.state.source.checkpoint_root = tmp_path / "out" / "ckpts"  # a job's own output folder

    def written() -> str:
        sup.books.write_status(force=True)
        return json.loads(sup.run.status.read_text())["checkpoint_dir"]

    assert written() == str(root.resolve())
    root.symlink_to(elsewhere)  # made by the job after the first write
    assert written() == str(elsewhere.resolve())
    assert written() == str(elsewhere.resolve())


# -- one incident, one action -------------------------------------------------


@pytest.mark.parametrize("in_process", [False, True])
def test_a_spike_confirmed_on_the_record_that_stopped_the_worker_is_not_a_second_rollback(
    tmp_path: Path, in_process: bool
) -> None:
    """A gradient explosion and a persisting loss spike on one record: one rollback, one budget spent,
    whether the worker is killed for it or rolls back in its own process."""
    sup = supervisor(
        tmp_path, policy={"spike_confirm_points": 2}, recover={"in_process_rollback": in_process}
    )
    sup.state.attempt.worker = FakeWorker()
    spike = Anomaly("loss_spike", "warning", 62, 62, "loss")
    explosion = Anomaly("grad_explosion", "critical", 63, 63, "grad_norm")
    assert sup.state.policy.on_raised(spike, 62) is None  # waits to be confirmed at step 63
    sup.state.detector.observe_step = lambda rec: [Transition("raised", explosion)] if rec.step == 63 else []
    step(sup, 63)
    rollbacks = [e for e in read_events(sup.run.events) if e.kind == "action" and e.name == "rollback"]
    assert [(e.step, e.data["anomaly"]) for e in rollbacks] == [(63, "grad_explosion")]
    # In process, the rollback is held as the pending action until the records read with it are handled.
    assert (
        sup.state.attempt.worker.signals == ([] if in_process else [signal.SIGKILL])
        and sup.state.pending is not None
    )
    assert sup.state.policy.used["rollback"] == 1


# -- stopping: real processes that ignore SIGTERM ------------------------------

STUBBORN = (
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
    + ("while True:\n    time.sleep(0.1)\n")
)


@pytest.fixture
def started() -> Iterator[list[WorkerProcess]]:
    """The processes a test started; any still alive afterwards (a failed test) are killed."""
    procs: list[WorkerProcess] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()


def stubborn(sup: Supervisor, started: list[WorkerProcess]) -> WorkerProcess:
    worker = WorkerProcess([sys.executable, "-c", STUBBORN], sup.run.logs / "worker-0.log")
    started.append(worker)
    wait_for(lambda: "ready" in worker.log_tail(), timeout=60, what="the stubborn worker to start")
    sup.state.attempt.worker = worker
    return worker


def test_a_second_ctrl_c_kills_a_worker_the_first_could_not_stop(tmp_path: Path, started: list) -> None:
    sup = supervisor(tmp_path)
    sup.state.stop.grace_s = 3600.0  # only the second Ctrl-C can end this worker
    worker = stubborn(sup, started)
    sup.controls.on_signal(signal.SIGINT)
    assert sup.state.status != "stopping"  # the handler only notes it: the loop's next turn asks
    sup.tick()
    assert (
        sup.state.status == "stopping" and worker.poll() is None
    )  # asked to stop (control file + SIGTERM): ignored
    (stop,) = [e for e in read_events(sup.run.events) if e.kind == "control" and e.name == "stop"]
    assert stop.data["issuer"] == "signal SIGINT"
    sup.controls.on_signal(signal.SIGINT)
    info = sup.supervise_attempt()
    assert info.returncode == -signal.SIGKILL and info.interrupted
    decision = decide(info, [], 0, 3)
    assert (decision.action, decision.classification) == ("stop", "user_interrupt")  # no restart after Ctrl-C


def test_a_worker_that_ignores_stop_is_killed_after_the_grace_period(tmp_path: Path, started: list) -> None:
    sup = supervisor(tmp_path)
    sup.state.stop.grace_s = 1.0
    said: list[str] = []
    sup.out.say = lambda text, style=None: said.append(text)
    worker = stubborn(sup, started)
    sup.controls.request_stop("operator")
    info = sup.supervise_attempt()  # returns only once the worker is gone
    assert worker.poll() == info.returncode == -signal.SIGKILL and info.interrupted
    assert "the worker did not stop in time: killing it" in said
    assert decide(info, [], 0, 3).classification == "user_interrupt"


# -- what the worker finds meets the policy ----------------------------------


@pytest.mark.parametrize("action", ["alert", "stop", "pause"])
def test_a_save_the_worker_refused_for_lack_of_disk_is_acted_on_as_configured(
    tmp_path: Path, action: str
) -> None:
    from steadytune.records import Event

    policy = {"rules": {"disk_low": {"action": action}}} if action != "alert" else {}
    sup = supervisor(tmp_path, policy=policy)
    done: list = []
    sup.actions.execute = lambda a, cause=None: done.append(a)  # type: ignore[method-assign]
    step(sup, 40)
    sup.handle(Event(ts=41.0, kind="anomaly", name="disk_low", severity="critical", step=40,
                     message="checkpoint at step 40 skipped: only 4 MiB free"))  # fmt: skip
    assert [a.name for a in done] == ([] if action == "alert" else [action])
    assert [e.name for e in read_events(sup.run.events)][-1] == "disk_low"


# -- after training, the wind-down -----------------------------------------------------------------


def test_after_rank_0s_last_words_silence_is_no_hang(tmp_path: Path) -> None:
    """torch's launcher took 6 s to end two ranks after training: with the hang judged by the step pace
    that was a stall, and a finished run was restarted to finish again."""
    from steadytune.records import Heartbeat, WorkerExit

    now = [100.0]
    sup = supervisor(tmp_path, detect={"pace": {"hang_floor_s": 6.0}})
    sup.state.clock = lambda: now[0]
    sup.state.attempt.worker = FakeWorker()
    for n in range(1, 11):
        now[0] += 0.5
        sup.handle(StepRecord(step=n, ts=now[0], loss=1.0, grad_norm=1.0))
    now[0] += 1.0
    sup.handle(WorkerExit(ts=now[0], step=10, status="completed"))
    now[0] += 60.0  # a minute of winding down, no heartbeat
    sup.pump()
    stalls = lambda: [e.step for e in read_events(sup.run.events) if e.name == "stall"]  # noqa: E731
    assert stalls() == [] and sup.state.attempt.phase == "finish"
    # Past setup_timeout_s it is judged again: a launcher stuck in its teardown is a hang after all.
    now[0] += sup.cfg.policy.setup_timeout_s
    sup.handle(Heartbeat(ts=now[0] - 30, step=10))  # rank 0 beats no more; an old beat of it
    sup.pump()
    assert stalls() == [10]


# -- a stop asked for ends the run stopped, however the worker ended on the way -------------------------


def test_a_worker_exit_that_would_restart_ends_a_run_stopped_while_a_stop_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C, the worker saved and ended, but its exit read as a crash (its last words not read yet,
    or the stop's own signal in its exit status): the run ends stopped. It crashed the supervisor
    (a restart decision has no end state) and a restart would train on after an operator's stop."""
    sup = supervisor(tmp_path)
    started: list[object] = []
    monkeypatch.setattr(sup, "prepare", lambda: None)
    monkeypatch.setattr(sup, "start_worker", lambda plan: started.append(plan))
    crash = ExitInfo(returncode=1, step=111, error_type="RuntimeError", error_message="stream closed")
    assert decide(crash, [], 0, 3).action == "restart"  # without the stop, a restart
    monkeypatch.setattr(sup, "supervise_attempt", lambda live=None: crash)
    sup.controls.on_signal(signal.SIGINT)
    result = sup.run_to_end()
    assert result.state == "stopped" and result.restarts == 0 and len(started) == 1
    assert "stopped on request" in result.reason and "RuntimeError" in result.reason
    ended = [e for e in read_events(sup.run.events) if e.name.startswith("run_")]
    assert [e.name for e in ended] == ["run_stopped"]

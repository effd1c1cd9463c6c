"""The fault matrix under axolotl, ms-swift and `accelerate launch --num_processes 2`, each for real.

Each tool trains the demo model through its own command line (tests/integration/toolruns.py)
under `steadytune supervise`, in three runs that the tests of a tool share (a tool's start
costs tens of seconds, so the faults that end in a restart follow each other in one run:
tests/integration/toolchain.py):

- **chain, --inject**: SIGKILL of the trainer, SIGKILL of the launcher, a truncated newest
  checkpoint and a kill, a SIGSTOPped trainer (a hang); the run then completes;
- **lr, --inject**: an LR of 3.0, rolled back live at 0.001 times it; then SIGTERM to the
  supervisor, which stops the tool through the guard (a checkpoint at the step it is on);
- **chain, no --inject** (the log-adapter path): SIGKILL of the trainer, then a hang; it completes.

Every fault's row (detected as, action, resumed from, steps redone, seconds to recover, end
state, weights finite) is printed as a ``FAULT-ROW`` line: ``pytest -s ... | grep FAULT-ROW``
gives the table in docs/recovery.md. ``analyze`` is held to the same runs' files in
test_analyze_tool_logs.py.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from steadytune.checkpoint.external import check_external_checkpoint
from steadytune.importers import load
from steadytune.records import Event, StepRecord, run_end
from steadytune.rundir import RunDir
from steadytune.telemetry.stream import iter_records
from tests.servers import Hook

from .runs import wait_for
from .toolchain import (
    HANG,
    KILL_LAUNCHER,
    KILL_TRAINER,
    TRUNCATE,
    Fault,
    Row,
    chain,
    job_weights,
    plan,
    restart_events,
    row,
    step_of,
)
from .toolruns import LAUNCHED, Supervised, alerts_config, all_finite, supervise, tool_job

# A chain's run is built in its first test's setup: five starts of a tool, each tens of seconds on a
# loaded machine, so more than the suite's 600 s a test.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

LR_ANOMALIES = ("loss_spike", "divergence", "grad_explosion", "nonfinite_grad", "nan_loss")
INJECTED_CHAIN = [KILL_TRAINER, KILL_LAUNCHER, TRUNCATE, HANG]
PLAIN_CHAIN = [KILL_TRAINER, HANG]
SCALE = 0.001


def _resume_arg(tool: str, step_dir: Path) -> list[str]:
    """How the tool's preset names a checkpoint to resume."""
    return {"axolotl": [f"--resume-from-checkpoint={step_dir}"]}.get(
        tool, ["--resume_from_checkpoint", str(step_dir)]
    )


def _lr_arg(tool: str, lr: float) -> list[str]:
    return [f"--learning-rate={lr:g}"] if tool == "axolotl" else ["--learning_rate", f"{lr:g}"]


# One module-scoped fixture per shared run, for each tool; a tool's tests stay on one xdist worker.
@pytest.fixture(
    scope="module", params=[pytest.param(t, marks=pytest.mark.xdist_group(f"tool-{t}")) for t in LAUNCHED]
)
def tool(request: pytest.FixtureRequest) -> str:
    return request.param


class Chained:
    def __init__(self, sup: Supervised, faults: list[Fault], rc: int, inject: bool) -> None:
        self.sup, self.faults, self.rc, self.inject = sup, faults, rc, inject

    def fault(self, name: str) -> Fault:
        return next(f for f in self.faults if f.name == name)


def _chain(tool: str, demo_assets: Path, tmp: Path, faults: list[str], inject: bool) -> Chained:
    # axolotl resumes by itself here: after the truncation, from the checkpoint cut short, unless the
    # restart names the whole one (test_a_truncated_newest_checkpoint_is_passed_over).
    extra = {"auto_resume_from_checkpoints": "true"} if tool == "axolotl" else {}
    job = tool_job(tool, demo_assets, tmp, 100, save_steps=10, logging_steps=2, **extra)
    args = ["--hang-floor", "6", "--max-restarts", "6", *(["--inject"] if inject else [])]
    with supervise(job, tmp, *args) as sup:
        made = chain(sup, job, faults)
        rc = sup.finish()
    run = "chain, --inject" if inject else "chain"
    for f in made:
        row(sup, f, inject, run).printed()
    return Chained(sup, made, rc, inject)


@pytest.fixture(scope="module")
def injected_chain(tool: str, demo_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Chained:
    return _chain(tool, demo_assets, tmp_path_factory.mktemp(f"{tool}-chain-inject"), INJECTED_CHAIN, True)


@pytest.fixture(scope="module")
def plain_chain(tool: str, demo_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Chained:
    return _chain(tool, demo_assets, tmp_path_factory.mktemp(f"{tool}-chain-plain"), PLAIN_CHAIN, False)


def _events_of(sup: Supervised, attempt: int) -> tuple[Event, Event]:
    """The restart that ended ``attempt`` and the start of the attempt after it."""
    events = sup.events()
    restart = restart_events(events)[attempt]
    started = next(e for e in events if e.name == "worker_started" and e.seq > restart.seq)
    return restart, started


def _resumed_at(c: Chained, f: Fault) -> int:
    """The checkpoint the attempt after ``f`` resumed, checked against the tool's own command and steps."""
    sup, job = c.sup, c.sup.job
    restart, started = _events_of(sup, f.attempt)
    resumed = step_of(plan(sup)[f.attempt + 1]["resume_checkpoint"])
    assert f"resuming from checkpoint-{resumed}" in restart.message
    want = _resume_arg(job.tool, job.checkpoint(resumed))
    assert started.data["cmd"][-len(want) :] == want, started.data["cmd"][-4:]
    # The tool took it: its first step after the restart continues the checkpoint, in every rank.
    after = [r for r in sup.steps() if r.attempt == f.attempt + 1]
    assert after, f"attempt {f.attempt + 1} recorded no step"
    first = after[0].step
    assert resumed < first <= resumed + (1 if c.inject else 2), (resumed, first)
    return resumed


def _completed(c: Chained) -> None:
    sup = c.sup
    assert c.rc == 0, sup.stdout[-3000:]
    assert run_end(sup.events()).name == "run_completed" and sup.status()["state"] == "completed"
    assert [r.step for r in sup.steps()][-1] == 100
    assert all_finite(job_weights(sup))
    assert sup.survivors() == []


# -- the chain, --inject --------------------------------------------------------------------------


def test_killed_trainer_and_launcher_restart_from_the_newest_whole_checkpoint(
    injected_chain: Chained,
) -> None:
    c = injected_chain
    sup = c.sup
    for name in (KILL_TRAINER, KILL_LAUNCHER):
        f = c.fault(name)
        resumed = _resumed_at(c, f)
        # The launcher's trainer may save once more before the supervisor kills the tree it left.
        assert resumed == f.whole if name == KILL_TRAINER else resumed >= f.whole
        _, started = _events_of(sup, f.attempt)
        killed = [e for e in sup.events() if e.name == "tree_killed" and e.seq < started.seq]
        if name == KILL_LAUNCHER:
            # Never two trainers at once: the orphaned trainers were killed before the next attempt began
            # (their data-loader workers may have ended with them first).
            assert f.trainers and set(f.trainers) <= {p for e in killed for p in e.data["pids"]}
    _completed(c)


def test_a_truncated_newest_checkpoint_is_passed_over(injected_chain: Chained) -> None:
    c = injected_chain
    f = c.fault(TRUNCATE)
    assert f.cut is not None and f.whole < f.cut
    corrupt = [e for e in c.sup.events() if e.name == "checkpoint_corrupt"]
    assert any(f"checkpoint-{f.cut}" in e.message and "cut short" in e.message for e in corrupt)
    assert _resumed_at(c, f) == f.whole


def test_a_stopped_trainer_is_a_stall_dumped_and_resumed(injected_chain: Chained) -> None:
    c = injected_chain
    f = c.fault(HANG)
    restart, _ = _events_of(c.sup, f.attempt)
    assert restart.data["classification"] in ("stall", "hang")
    dumped = [e for e in c.sup.events() if e.name == "stacks_dumped" and e.seq < restart.seq]
    assert dumped and f.pids[0] in dumped[-1].data["pids"]
    assert "Fatal Python error" in Path(dumped[-1].data["file"]).read_text()
    assert _resumed_at(c, f) == f.whole
    _completed(c)


def test_the_guard_ran_in_every_rank(injected_chain: Chained) -> None:
    """accelerate launch --num_processes 2: a stream per rank, each with every step of each attempt."""
    sup = injected_chain.sup
    files = RunDir(sup.run).telemetry_files()
    ranks = 2 if sup.job.tool == "accelerate" else 1
    assert [p.name for p in files] == [f"rank-{r}.jsonl" for r in range(ranks)]
    for path in files:
        recs = list(iter_records(path))
        injected = [r for r in recs if isinstance(r, Event) and r.name == "guard_injected"]
        assert len(injected) == len(INJECTED_CHAIN) + 1  # once per attempt
        last = [r.step for r in recs if isinstance(r, StepRecord) and r.attempt == len(INJECTED_CHAIN)]
        assert last and last[-1] == 100 and last == list(range(last[0], 101))


# -- the chain, without --inject: the log adapter -----------------------------------------------------


def test_without_the_guard_a_kill_and_a_hang_are_recovered_from_the_log(plain_chain: Chained) -> None:
    c = plain_chain
    for f in c.faults:
        resumed = _resumed_at(c, f)
        assert resumed == f.whole
    restart, _ = _events_of(c.sup, c.fault(HANG).attempt)
    assert restart.data["classification"] in ("stall", "hang")
    _completed(c)
    assert not (c.sup.run / "telemetry" / "rank-1.jsonl").exists()


# -- an LR far too high, then SIGTERM to the supervisor -----------------------------------------------


@pytest.fixture
def hook() -> Hook:
    h = Hook()
    yield h
    h.close()


def test_lr_far_too_high_is_rolled_back_and_sigterm_then_stops_it_cleanly(
    tool: str, demo_assets: Path, tmp_path: Path, hook: Hook
) -> None:
    """LR 3.0 diverges within a few steps. swift and accelerate save every step, so the rollback resumes
    the checkpoint before the trouble; axolotl saves every other step and resumes by itself
    (auto_resume_from_checkpoints), so its rollback to the start must keep it from taking the newest
    checkpoint, which the diverged timeline wrote."""
    lr = 3.0
    extra = {"auto_resume_from_checkpoints": "true"} if tool == "axolotl" else {}
    save = 2 if tool == "axolotl" else 1
    job = tool_job(tool, demo_assets, tmp_path, 400, save_steps=save, logging_steps=1, lr=lr, **extra)
    cfg = alerts_config(tmp_path, "TEST_HOOK_URL", rollback_lr_scale=SCALE)
    seen: list[int] = []
    checked: list[int] = []  # the newest event's seq when the stop was about to be sent
    with supervise(
        job, tmp_path, "--config", str(cfg), "--base-lr", str(lr), "--inject", "--stop-grace", "90",
        env={"TEST_HOOK_URL": hook.url},
    ) as sup:  # fmt: skip

        def rolled_back() -> bool:
            """3 steps of the attempt the rollbacks led to, which no rollback has ended since: a rollback
            that resumed a checkpoint the divergence had already reached (the loss of the step after it
            is the step's from before) is followed by another, and a stop sent as that one kills the
            worker would find no trainer to take it."""
            if sup.alive() and sup.named("rollback") and not seen:
                seen.extend(job.checkpoints())  # what the abandoned timeline left in the folder
            events = sup.events()
            started = [e for e in events if e.name == "worker_started"]
            latest = len(started) - 1
            ended = any(e.name == "rollback" and e.seq > started[-1].seq for e in events)
            ready = latest >= 1 and not ended and len([r for r in sup.steps() if r.attempt == latest]) >= 3
            if ready:
                checked[:] = [max(e.seq or 0 for e in events)]
            return ready

        wait_for(rolled_back, timeout=600, what="3 steps after the rollbacks")
        stop_sent = sup.status().get("step") or 0
        sup.proc.send_signal(signal.SIGTERM)
        rc = sup.finish(timeout=240)
    events = sup.events()
    names = [e.name for e in events]
    first_bad = next((e for e in events if e.kind == "anomaly" and e.name in LR_ANOMALIES), None)
    assert first_bad is not None, names
    lr_row = row(sup, Fault(f"LR {lr:g}", 0, first_bad.ts, 0), True, "lr, --inject")
    lr_row.recover_s = round(
        next(r for r in sup.steps() if r.attempt == 1).ts - first_bad.ts, 1
    )  # from the anomaly, as the fault is the LR itself
    lr_row.printed()
    # The rollback: after the anomaly, at the lowered LR, through the tool's own LR argument.
    rollback = events[names.index("rollback")]
    assert events.index(first_bad) < events.index(rollback)
    restart = next(e for e in restart_events(events) if e.seq > rollback.seq)
    assert restart.data["lr_scale"] == pytest.approx(SCALE)
    cmd = next(e for e in events if e.name == "worker_started" and e.seq > restart.seq).data["cmd"]
    assert cmd[-len(_lr_arg(tool, lr * SCALE)) :] == _lr_arg(tool, lr * SCALE)
    after = [r for r in sup.steps() if r.attempt == 1]
    low = lr * SCALE * 1.0001
    assert all(r.lr is not None and r.lr <= low for r in after), [(r.step, r.lr) for r in after]
    resumed = restart.data.get("resume_checkpoint")
    if resumed is not None:  # a checkpoint from before the trouble, if one is left (the HF script keeps 3)
        assert step_of(resumed) < first_bad.step
    elif tool == "axolotl":
        # Back to the start: axolotl, which resumes by itself here, is told not to look at what the
        # diverged timeline saved (seen: the checkpoints in its folder when the rollback was decided).
        assert "--no-auto-resume-from-checkpoints" in cmd, (cmd[-3:], seen)
    assert after[0].step == step_of(resumed) + 1  # the tool took the resume it was given, or started over
    wait_for(lambda: any(first_bad.name in str(b) for b in hook.bodies), timeout=30, what="the webhook alert")
    # SIGTERM: the guard's stop request, a checkpoint at the step it was on, no process left.
    saved = [s for s in job.checkpoints() if s >= stop_sent]
    Row(tool, "SIGTERM supervisor", True, "lr, --inject", "stop request", "stop", None, None, None,
         sup.status().get("state"),
         all_finite(job.checkpoint(saved[-1]) / job.weights_file) if saved else None).printed()  # fmt: skip
    assert rc == 128 + signal.SIGTERM, sup.stdout[-3000:]
    assert run_end(events).name == "run_stopped" and "stop_requested" in names[names.index("rollback") :]
    requested = events[names.index("stop_requested")].seq or 0
    tail = [(e.name, e.step, e.message[:80]) for e in events if (e.seq or 0) >= checked[0]]
    if any(e.name == "rollback" and checked[0] < (e.seq or 0) < requested for e in events):
        # The attempt the stop was aimed at diverged again between the last look and the signal (its
        # checkpoint held the divergence): the rollback was killing that worker, so no trainer was left
        # to take the stop. The run must end there, stopped, and nothing may start after the request.
        assert not any(e.name == "worker_started" and (e.seq or 0) > requested for e in events), tail
        assert sup.survivors() == [] and sup.status()["state"] == "stopped", tail
        return
    # The guard took the stop at a step boundary (ack_stop), saved there, and the trainer ended.
    assert "ack_stop" in names[names.index("stop_requested") :], tail
    stopped = run_end(events)
    assert stopped.data["signal"] == "SIGTERM" and stopped.data["graceful"] is True
    assert stopped.data["killed_pids"] == [] and sup.survivors() == []
    assert sup.status()["state"] == "stopped"
    assert saved and check_external_checkpoint(job.checkpoint(saved[-1])) == (True, "")
    assert all_finite(job.checkpoint(saved[-1]) / job.weights_file)


# -- analyze, on what the same runs wrote ---------------------------------------------------------------


def test_analyze_reads_each_tools_own_logs_as_its_trainer_state(plain_chain: Chained) -> None:
    """The console log of the run's first attempt (axolotl's stdout, accelerate's two ranks in one
    stream, ms-swift's dicts) up to the checkpoint it was killed after, held to that checkpoint's
    trainer_state.json; and ms-swift's logging.jsonl, appended to by every attempt, to the final one's."""
    sup = plain_chain.sup
    killed = plain_chain.fault(KILL_TRAINER)
    state = killed.state
    logged = {e["step"]: e for e in state["log_history"] if "loss" in e}
    series = load(sup.run / "logs" / "worker-0.log")
    assert series.format == "dict_log"
    got = {r.step: r for r in series.records if r.loss is not None and r.step <= state["global_step"]}
    assert sorted(got) == sorted(logged)
    for step, entry in logged.items():
        assert got[step].loss == pytest.approx(entry["loss"], rel=1e-3)
        assert got[step].grad_norm == pytest.approx(entry["grad_norm"], rel=1e-3)
    if sup.job.tool != "swift":
        return
    job = sup.job
    final = json.loads((job.checkpoint(100) / "trainer_state.json").read_text())
    logged = {e["step"]: e for e in final["log_history"] if "loss" in e}
    series = load(job.out / "logging.jsonl")
    assert series.format == "jsonl_log"
    got = {r.step: r for r in series.records if r.loss is not None}
    assert sorted(got) == sorted(logged)  # the redone steps once each: the attempt that stood
    for step, entry in logged.items():
        assert got[step].loss == pytest.approx(entry["loss"], rel=1e-6)
        assert got[step].grad_norm == pytest.approx(entry["grad_norm"], rel=1e-6)

"""Where a restarted run resumes, and whether it did: the supervisor's resume bookkeeping.

Which checkpoints a resume may use (whole, per the source's test; not one a resume
already failed on; not one the timeline a rollback left behind wrote), what a restart
after a crash, a hang or a rollback changes, the fallback when a resume dies before its
first step, and the check that the first step after a resume continues its checkpoint.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from steadytune.checkpoint.manifest import checkpoint_step
from steadytune.policy.engine import Action
from steadytune.policy.plan import onset_step
from steadytune.policy.restart import Decision, ExitInfo
from steadytune.records import Anomaly, StepRecord
from steadytune.supervise.outbox import Outbox
from steadytune.supervise.publishing import Publishes
from steadytune.supervise.replay import StateKeeper, replay_detector
from steadytune.supervise.restarts import (
    anomaly_event_data,
    crash_restart,
    own_resume_note,
    resume_expectation,
    resume_problems,
    rollback_restart,
)
from steadytune.supervise.runstate import RunState
from steadytune.supervise.source import LR, PLAN, SKIP_STEP


class Resumes:
    """The resume points of one run and what its restarts change."""

    def __init__(self, state: RunState, out: Outbox, publishes: Publishes) -> None:
        self.state, self.out, self.publishes = state, out, publishes
        self._bad_checkpoints: set[Path] = set()  # a resume from these failed before its first step
        self._reported: set[Path] = set()  # unusable checkpoints already reported
        self._abandoned: dict[Path, int] = {}  # checkpoints of a timeline a rollback left, as they were
        self._expect: dict[str, float] | None = None  # what the first record after a resume should show
        self.keeper = StateKeeper(state.run, state.cfg.detect)

    def expect(self, resume: Path | None) -> None:
        """The attempt starting now resumes ``resume``: its first step is checked against it."""
        self._expect = resume_expectation(resume) if resume is not None else None

    def on_first_step(self, rec: StepRecord) -> None:
        """A watched job's first step past where its attempt was started: it resumed by itself; said
        (its ``worker_started`` could not know, and "a new process" reads like step 0)."""
        source, plan = self.state.source, self.state.plan
        if PLAN in source.abilities or not source.steps_are_real():
            return  # a step counted from log lines starts where the adapter was told
        began = (checkpoint_step(Path(plan.resume_checkpoint)) or 0) if plan.resume_checkpoint else 0
        steps = (checkpoint_step(p) or 0 for p in source.checkpoints())
        if (note := own_resume_note(rec.step, began, steps)) is not None:
            self.out.emit("lifecycle", "job_resumed_itself", note, step=rec.step, data={"began": began})

    def on_first_loss(self, rec: StepRecord) -> None:
        if self._expect is not None and rec.loss is not None:
            self.check_resume(rec, self._expect)
            self._expect = None

    def rewind(self, resume: str | None, world_size: int | None = None, cleared_by: str = "restart") -> None:
        """A new timeline from ``resume``: detection starts again there, and its first step is checked.

        Open anomalies belong to the abandoned timeline: they are resolved, and the detectors are
        rebuilt by replaying the kept history up to the resume step (the latest attempt of each step),
        so baselines survive the restart. With ``world_size``, the ranks a smaller job no longer has
        are left out (a rank that is gone is no straggler). ``cleared_by`` names what cleared them
        (``rollback`` for one done inside the running worker: no restart happened).
        """
        st = self.state
        for a in st.detector.open_anomalies():
            self.out.emit(
                "resolved",
                a.kind,
                f"resolved {a.kind}: cleared by the {cleared_by}",
                step=a.end_step,
                data={**anomaly_event_data(a), "cleared_by": cleared_by},
            )
        step = (checkpoint_step(Path(resume)) if resume else 0) or 0
        st.policy.forget_open(step)
        self.keeper.wait()  # its state is the replay's start
        st.detector = replay_detector(st.run, st.cfg.detect, step, world_size=world_size)
        # The episodes the replay rebuilt were told on the timeline up to the resume step, and ended
        # there or just now, as cleared: none may be resolved again.
        st.detector.settle_episodes()
        st.progress.rewind(step, st.attempt.number)
        self.expect(Path(resume) if resume else None)

    def keep_replay_state(self) -> None:
        """A save was reported: the replay's saved state is brought up to the save before it.

        A restart resumes from the newest checkpoint, so its replay then starts at most one
        checkpoint interval back. The save before the newest, not the newest: every rank has
        written its step by the time the next save is reported (a state missing one rank's record
        of its own step is not used). In a thread (:class:`~.replay.StateKeeper`): the loop goes on.
        """
        saves = self.state.history.checkpoint_steps
        if len(saves) >= 2:
            self.keeper.keep_up(saves[-2])

    def usable_checkpoints(self, before: int | None = None) -> list[tuple[Path, int]]:
        """Checkpoints the source can resume from, newest first; unusable ones are reported once."""
        out = []
        for path in self.state.source.checkpoints():
            step = checkpoint_step(path) or 0
            if (before is not None and step >= before) or path in self._bad_checkpoints:
                continue
            if self._abandoned.get(path) == _saved_at(path):
                continue  # written by the timeline a rollback left (and not saved again since)
            problem = self.state.source.problem(path)
            if problem is None:
                out.append((path, step))
                if before is None:
                    break  # the newest whole one is all a resume needs; older ones are not read
            elif self.publishes.unfinished(step):
                continue  # on its way, not broken: the worker that publishes it still runs
            elif path not in self._reported:
                self._reported.add(path)
                self.out.emit(
                    "anomaly",
                    "checkpoint_corrupt",
                    f"{path.name} skipped for resume: {problem}",
                    step=step,
                    severity="warning",
                    data={"path": str(path), "reason": problem},
                )
        return out

    def resume_point(self) -> str | None:
        """The newest checkpoint that verifies; unusable ones are reported and skipped."""
        found = self.usable_checkpoints()
        return str(found[0][0]) if found else None

    def check_resume(self, rec: StepRecord, expect: dict[str, float]) -> None:
        """The first step after a resume continues the checkpoint: its epoch, its step, its loss."""
        problems = resume_problems(rec, expect, self.state.source.steps_are_real())
        if problems:
            self.out.emit(
                "anomaly",
                "resume_mismatch",
                f"the run did not resume from checkpoint-{int(expect['step'])}: " + "; ".join(problems),
                severity="critical" if len(problems) > 1 or "epoch" in problems[0] else "warning",
                step=rec.step,
                data={"expected": expect, "got": {"step": rec.step, "epoch": rec.epoch, "loss": rec.loss}},
            )

    def nonfinite_end(self, info: ExitInfo) -> Anomaly | None:
        """The open NaN/Inf anomaly a completed attempt ended with, where no guard kept it from the
        weights."""
        if info.status != "completed" or SKIP_STEP in self.state.source.abilities:
            return None
        for a in self.state.detector.open_anomalies():
            if a.kind in {"nan_loss", "nonfinite_grad"}:
                return a
        grad = self.state.progress.last_grad_norm
        if grad is not None and not math.isfinite(grad):
            # A tool that filters NaN losses from its logs (HF's logging_nan_inf_filter) still shows the
            # gradients: a run whose last update was non-finite left non-finite weights.
            return Anomaly(
                "nonfinite_grad",
                "critical",
                self.state.progress.step,
                self.state.progress.step,
                "grad_norm",
            )
        return None

    def failed_resume(self, info: ExitInfo, decision: Decision) -> Decision | None:
        """An attempt that died loading its checkpoint, before any step: that checkpoint is the suspect.

        The next older whole one gets its chance (a restart, from the budget), with an event.
        """
        resume = self.state.plan.resume_checkpoint
        if not (info.deterministic and resume and self.state.planner.budget_left()):
            return None
        path = Path(resume)
        self._bad_checkpoints.add(path)
        self.out.emit(
            "anomaly",
            "resume_failed",
            f"resuming from {path.name} failed before the first step "
            f"({info.error_type or f'exit {info.returncode}'}: {info.error_message or ''}); "
            "falling back to an older checkpoint",
            severity="warning",
            step=checkpoint_step(path),
            data={"checkpoint": path.name, "error": info.error_message},
        )
        return Decision("restart", "resume_failed", f"resume from {path.name} failed", 0.0)

    def plan_after_crash(self, decision: Decision) -> tuple[dict[str, Any] | None, str, str]:
        """Resume from the newest verified checkpoint; after an OOM, also change what ran out."""
        resume = self.resume_point()
        where = f"; resuming from {Path(resume).name if resume else 'the start'}"
        if PLAN not in self.state.source.abilities:  # a job's shape is its own: resume it as it was
            return {"resume_checkpoint": resume}, decision.classification, decision.reason + where
        changes, kind, why = crash_restart(self.state.plan, decision, resume, self.state.cfg)
        return changes, kind, why + where

    def plan_after_action(self, action: Action) -> tuple[dict[str, Any] | None, str, str]:
        """The restart plan for a worker the supervisor stopped on purpose (a restart, a rollback)."""
        if action.name == "restart":
            kind = action.anomaly.kind if action.anomaly else action.name
            resume = self.resume_point()
            return (
                {"resume_checkpoint": resume},
                kind,
                f"{kind}: {action.reason}; resuming from {Path(resume).name if resume else 'the start'}",
            )
        start = onset_step(action.anomaly) if action.anomaly is not None else action.step
        verified = {step: path for path, step in self.usable_checkpoints(before=start)}
        changes, kind, why, target = rollback_restart(
            self.state.plan,
            action,
            sorted(verified),
            self.state.history.rollback_resumes,
            self.state.source.checkpoint_root or self.state.run.checkpoints,
            # Where the rollback was decided, not where the worker got to while it was carried out (a
            # wait for a checkpoint being published, a kill): the steps after it are not suspect.
            action.step,
            self.state.history.samples_by_step,
            self.state.cfg.policy.rollback_lr_scale,
            # A timeline that has not yet gone a healthy window past its checkpoint (LAST_GOOD's) has
            # not left the trouble behind.
            self.state.cfg.run.good_window_steps,
        )
        if target is not None:
            # A checkpoint from before the trouble that the rollback waited for and did not get: say why it
            # went further back.
            why += "".join(f"; {note}" for note in self.publishes.passed_over(target, start))
            self.state.history.rollback_resumes.append(target)
            self.abandon_after(target)
            if target in verified and changes is not None:
                target_dir = verified[target]
                if changes.get("lr_scale") not in (None, self.state.plan.lr_scale):
                    target_dir = self.state.source.resume_copy(target_dir)
                changes["resume_checkpoint"] = str(target_dir)
            if LR not in self.state.source.abilities:
                why += (
                    "; the LR is unchanged (give --preset or --lr-arg to lower it, and --base-lr where the "
                    "job logs no LR)"
                )
        return changes, kind, why

    def abandon_after(self, target: int) -> None:
        """The timeline after checkpoint ``target`` is left behind: its checkpoints are no resume point."""
        self.state.history.checkpoint_steps = [s for s in self.state.history.checkpoint_steps if s <= target]
        for path in self.state.source.checkpoints():
            if (checkpoint_step(path) or 0) > target:
                self._abandoned[path] = _saved_at(path)


def _saved_at(checkpoint: Path) -> int:
    """When a checkpoint was last written (its trainer state, else the folder): a re-save changes it."""
    for p in (checkpoint / "trainer_state.json", checkpoint):
        try:
            return p.stat().st_mtime_ns
        except OSError:
            continue
    return 0

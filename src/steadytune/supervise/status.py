"""What the supervisor keeps on disk about a run as it goes: ``status.json``, LAST_GOOD, the disk need.

``status.json`` is what ``steadytune status``, the dashboard and the server read without asking
the supervisor; LAST_GOOD names the newest checkpoint that a window of healthy steps followed;
the disk need (checkpoints still to come, at the size of the newest) feeds the disk_low detector.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from steadytune.checkpoint.manifest import checkpoint_step
from steadytune.checkpoint.store import read_pointer, write_pointer
from steadytune.rundir import atomic_write_text
from steadytune.supervise.runstate import RunState


class RunBooks:
    """The run's books: the status file and the LAST_GOOD pointer, kept from the run's state."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.dashboard_url: str | None = None  # where alerts and ``status`` point people, when one serves
        self._last_status = 0.0
        # The checkpoint folder, resolved once it is there (a walk of its path's parts every second, for
        # a value that does not change); until then each write resolves it, as a job may make it a link.
        self._root: tuple[Path | None, str | None] = (None, None)
        # Saves judged for good: their window passed with trouble in it, or their folder is not there
        # (a job that checkpoints elsewhere). Without it every tick went over every save of the run.
        self._never: set[int] = set()
        self._seen_step = 0
        # LAST_GOOD's step when last read or written (-1: none): saves at or below it are not judged,
        # so the pointer is read only when a save is due (not at every turn, a file read and a stat).
        self._floor = -1
        # The saves newest first, sorted again only when the list changed (a save reported, a rollback's
        # cut): sorted at every turn, a run saving every 300 steps sorted 3,300 of them a turn at 1M steps.
        self._saves_of: list[int] | None = None
        self._saves_n = 0
        self._saves: list[int] = []

    def write_status(self, force: bool = False) -> None:
        st = self.state
        now = st.clock()
        # Written at most once a second: the loop polls far more often, and readers only need it fresh.
        if not force and now - self._last_status < 1.0:
            return
        self._last_status = now
        progress, worker = st.progress, st.attempt.worker
        status = {
            "run_id": st.run.run_id,
            "state": st.status,
            "step": progress.step,
            "max_steps": progress.max_steps,
            "loss": progress.last_loss,
            "eval_loss": progress.last_eval_loss,
            "tokens_per_s": progress.tokens_per_s,
            "eta_s": progress.eta_s,
            "attempt": st.attempt.number,
            "restarts": st.planner.total,
            "last_checkpoint": st.source.latest_checkpoint(),
            # Where the dashboard and /metrics find them: a supervised command saves into its own folder.
            "checkpoint_dir": self._checkpoint_dir(st.source.checkpoint_root),
            "supervisor_pid": os.getpid(),
            "worker_pid": worker.pid if worker and st.attempt.running() else None,
            "worker_start": worker.how if worker else None,  # a new process, or the standby worker
            "standby_pid": st.source.standby_pid(),
            "source": st.source.label,
            "updated_ts": now,
            "dashboard_url": self.dashboard_url,
            "started_ts": st.started_ts,
        }
        # Rewritten every second: the state of a moment, not a record (events.jsonl is the record).
        atomic_write_text(st.run.status, json.dumps(status, indent=1), durable=force)

    def _checkpoint_dir(self, root: Path | None) -> str | None:
        if not root:
            return None
        if root == self._root[0]:
            return self._root[1]
        resolved = str(root.resolve())
        if root.is_dir():
            self._root = (root, resolved)
        return resolved

    def update_disk_need(self, step: int) -> None:
        """Checkpoints still to come, at the size of the newest one, feed the disk_low detector."""
        from steadytune.preflight.disk import run_disk_need

        st = self.state
        need = run_disk_need(
            st.run.checkpoints, st.cfg.run.keep_last, st.cfg.train.save_steps, st.progress.max_steps, step
        )
        st.detector.set_projected_disk_need(need)

    def update_last_good(self) -> None:
        """A checkpoint becomes LAST_GOOD once a window of healthy steps has followed it.

        The pointer is read (it may name a save of an earlier supervisor) only when a save newer than
        it is due to be judged: at most once per save, not at every turn.
        """
        st = self.state
        window = st.cfg.run.good_window_steps
        if st.progress.step < self._seen_step:  # a rollback: a step judged before may be saved again
            self._never.clear()
        self._seen_step = st.progress.step
        saves = self._newest_first(st.history.checkpoint_steps)
        if not any(self._due(step, window) for step in self._above(saves, self._floor)):
            return
        current = read_pointer(st.run.last_good_pointer)
        self._floor = (checkpoint_step(current) if current else -1) or -1
        for step in self._above(saves, self._floor):
            if not self._due(step, window):
                continue
            healthy = not any(step < t <= step + window for t in st.history.trouble_steps)
            target = st.run.checkpoints / f"checkpoint-{step}"
            if healthy and target.is_dir():
                write_pointer(st.run.last_good_pointer, target)
                self._floor = step
                break
            self._never.add(step)

    def _newest_first(self, saves: list[int]) -> list[int]:
        # The history only appends to its list, or replaces it whole: its identity and length tell a change.
        if saves is not self._saves_of or len(saves) != self._saves_n:
            self._saves_of, self._saves_n = saves, len(saves)
            self._saves = sorted(saves, reverse=True)
        return self._saves

    @staticmethod
    def _above(saves: list[int], floor: int) -> Iterator[int]:
        """The saves (newest first) above ``floor``."""
        for step in saves:
            if step <= floor:
                return
            yield step

    def _due(self, step: int, window: int) -> bool:
        """Whether save ``step`` is to be judged now: its window is over (or the run complete), and it
        was not judged for good before."""
        st = self.state
        done = st.progress.step >= step + window or st.status == "completed"
        return done and step not in self._never

"""What the supervisor keeps on disk about a run as it goes: ``status.json``, LAST_GOOD, the disk need.

``status.json`` is what ``steadytune status``, the dashboard and the server read without asking
the supervisor; LAST_GOOD names the newest checkpoint that a window of healthy steps followed;
the disk need (checkpoints still to come, at the size of the newest) feeds the disk_low detector.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from steadytune.checkpoint.manifest import checkpoint_step
from steadytune.checkpoint.store import read_pointer, write_pointer
from steadytune.rundir import atomic_write_text

if TYPE_CHECKING:
    from steadytune.supervise.supervisor import Supervisor


class RunBooks:
    """The supervisor's books: the status file and the LAST_GOOD pointer, from the state it owns."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self._last_status = 0.0

    def write_status(self, force: bool = False) -> None:
        sup = self.sup
        now = sup.clock()
        # Written at most once a second: the loop polls far more often, and readers only need it fresh.
        if not force and now - self._last_status < 1.0:
            return
        self._last_status = now
        progress = sup.progress
        status = {
            "run_id": sup.run.run_id,
            "state": sup.state,
            "step": progress.step,
            "max_steps": progress.max_steps,
            "loss": progress.last_loss,
            "eval_loss": progress.last_eval_loss,
            "tokens_per_s": progress.tokens_per_s,
            "eta_s": progress.eta_s,
            "attempt": sup.attempt,
            "restarts": sup.planner.total,
            "last_checkpoint": sup.source.latest_checkpoint(),
            "supervisor_pid": os.getpid(),
            "worker_pid": sup.worker.pid if sup.worker and sup.worker.poll() is None else None,
            "worker_start": sup.worker.how if sup.worker else None,  # a new process, or the standby worker
            "standby_pid": sup.source.standby_pid(),
            "source": sup.source.label,
            "updated_ts": now,
            "dashboard_url": sup.dashboard_url,
            "started_ts": sup.started_ts,
        }
        # Rewritten every second: the state of a moment, not a record (events.jsonl is the record).
        atomic_write_text(sup.run.status, json.dumps(status, indent=1), durable=force)

    def update_disk_need(self, step: int) -> None:
        """Checkpoints still to come, at the size of the newest one, feed the disk_low detector."""
        from steadytune.preflight.disk import run_disk_need

        sup = self.sup
        need = run_disk_need(
            sup.run.checkpoints,
            sup.cfg.run.keep_last,
            sup.cfg.train.save_steps,
            sup.progress.max_steps,
            step,
        )
        sup.detector.set_projected_disk_need(need)

    def update_last_good(self) -> None:
        """A checkpoint becomes LAST_GOOD once a window of healthy steps has followed it."""
        sup = self.sup
        window = sup.cfg.run.good_window_steps
        current = read_pointer(sup.run.last_good_pointer)
        current_step = checkpoint_step(current) if current else -1
        for step in sorted(sup.checkpoint_steps, reverse=True):
            if step <= (current_step or -1):
                break
            done = sup.progress.step >= step + window or sup.state == "completed"
            healthy = not any(step < t <= step + window for t in sup.trouble_steps)
            target = sup.run.checkpoints / f"checkpoint-{step}"
            if done and healthy and target.is_dir():
                write_pointer(sup.run.last_good_pointer, target)
                break

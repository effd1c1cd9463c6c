"""One incident, one alert, through a rollback: the README's high-LR demo, read from its events.jsonl.

At 100x its usual learning rate and without clipping, the demo raises a loss spike and gradient spikes;
whether it goes on to diverge depends on the libraries' numerics (with transformers 5.25 it learns on),
so the incident is made certain: 30x that LR for one update at step 45, past the first verified
checkpoint (``$STEADYTUNE_FAULTS``). The loss diverges and the run is rolled back inside the running
worker. Before the episodes, one trouble was several episodes (three ``grad_explosion`` ones for the
model, the embeddings and layer 0, each raised and cleared by the rollback on its own), and the
detector rebuilt for the new timeline resolved the episodes it replayed a second time. The model's
and its layers' explosion as one episode is tested on generated findings
(tests/unit/detect/test_episodes.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from steadytune.telemetry.events import read_events

from .runs import STEADYTUNE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def high_lr_run(tmp_path_factory: pytest.TempPathFactory, demo_assets: Path) -> Path:
    runs = tmp_path_factory.mktemp("high-lr") / "runs"
    burst = {"lr_burst_at_step": 45, "lr_burst_factor": 30.0, "lr_burst_steps": 1}
    out = subprocess.run(
        [STEADYTUNE, "demo", "--runs-dir", str(runs), "--steps", "120", "--quiet",
         "train.learning_rate=0.3", "train.max_grad_norm=0",
         "alerts.sinks=[{type: jsonl, path: alerts.jsonl}]"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "STEADYTUNE_FAULTS": json.dumps(burst)},
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    (run,) = runs.iterdir()
    return run


def _episode(data: dict) -> tuple:
    return data["kind"], data["metric"], data.get("rank"), data["start_step"]


def test_each_episode_is_raised_once_and_resolved_once_through_the_rollback(high_lr_run: Path) -> None:
    events = read_events(high_lr_run / "events.jsonl")
    done = next(e for e in events if e.name == "rolled_back")
    assert done.data["in_process"] is True, "the case in point is a rollback inside the worker"
    episodes = [e for e in events if e.kind in ("anomaly", "resolved") and "start_step" in e.data]
    told = [e for e in episodes if e.kind == "anomaly" and "escalated_from" not in e.data]
    raised = Counter(_episode(e.data) for e in told)
    resolved = Counter(_episode(e.data) for e in episodes if e.kind == "resolved")
    assert raised and all(n == 1 for n in raised.values()), raised
    assert all(n == 1 for n in resolved.values()), f"resolved more than once: {resolved}"
    assert set(resolved) <= set(raised)
    # What was open when the rollback came is said to be cleared by it.
    cleared = [e for e in episodes if e.kind == "resolved" and "cleared_by" in e.data]
    assert cleared and all(e.data["cleared_by"] == "rollback" for e in cleared)
    assert [e.name for e in events if e.kind == "lifecycle"][-1] == "run_completed"


def test_the_incident_rolled_back_is_one_alert_raised_and_one_resolved(high_lr_run: Path) -> None:
    events = read_events(high_lr_run / "events.jsonl")
    rollback = next(e for e in events if e.kind == "action" and e.name == "rollback")
    (cause,) = [
        e for e in events if e.kind == "anomaly" and e.step == rollback.step and e.severity == "critical"
    ]
    # One anomaly of a kind at a step, whatever the rules: one raise at the sinks, one RESOLVED.
    assert max(Counter((e.name, e.step) for e in events if e.kind == "anomaly").values()) == 1
    alerts = [json.loads(line) for line in (high_lr_run / "alerts.jsonl").read_text().splitlines()]
    told = Counter((a["name"], a["metric"]) for a in alerts if a["kind"] == "anomaly")
    over = Counter((a["name"], a["metric"]) for a in alerts if a["kind"] == "resolved")
    key = (cause.name, cause.data["metric"])
    assert told[key] == over[key] == 1
    assert sum(over.values()) == sum(told.values())

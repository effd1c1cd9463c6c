"""A supervised job's restarts and its end reach a real local webhook, as ``alerts.notify_on`` says."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from steadytune.telemetry.events import read_events
from tests.servers import Hook

from .hfjob import supervise_cmd

CONFIG = (
    "run: {max_restarts: 2, restart_backoff_s: 0.1}\n"
    "alerts:\n  sinks:\n    - type: webhook\n      format: generic\n      url_env: TEST_HOOK_URL\n"
)


def _supervise(tmp_path: Path, python: str, hook: Hook, exit_code: int, config: str = CONFIG) -> list:
    """Supervise a job that logs one step and exits with ``exit_code``; the run's events."""
    cfg = tmp_path / "supervise.yaml"
    cfg.write_text(config)
    job = [
        python, "-c",
        "import sys, time; print({'loss': 1.0, 'epoch': 0.1}, flush=True); time.sleep(0.3); "
        f"sys.exit({exit_code})",
    ]  # fmt: skip
    cmd = supervise_cmd(job, tmp_path / "out", tmp_path / "runs", "job", "--config", str(cfg))
    env = {**os.environ, "TEST_HOOK_URL": hook.url}
    subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    return read_events(tmp_path / "runs" / "job" / "events.jsonl")


def test_a_crash_looping_job_alerts_each_restart_and_its_failure(tmp_path: Path, stdlib_python: str) -> None:
    hook = Hook()
    try:
        events = _supervise(tmp_path, stdlib_python, hook, exit_code=3)
    finally:
        hook.close()
    restarts = [e for e in events if e.name == "restart" and "classification" in e.data]
    assert len(restarts) == 2 and any(e.name == "run_failed" for e in events)
    sent = [(b["alert"]["name"], b["alert"]["severity"]) for b in hook.bodies]
    assert sent == [("restart", "warning"), ("restart", "warning"), ("run_failed", "critical")]
    alerts = [e for e in events if e.kind == "alert"]
    assert [(e.name, e.data["status"], e.data["delivered"]) for e in alerts] == [
        ("restart", "delivered", ["webhook"]),
        ("restart", "delivered", ["webhook"]),
        ("run_failed", "delivered", ["webhook"]),
    ]


def test_a_completed_job_sends_one_finish_alert(tmp_path: Path, stdlib_python: str) -> None:
    hook = Hook()
    try:
        events = _supervise(tmp_path, stdlib_python, hook, exit_code=0)
    finally:
        hook.close()
    assert any(e.name == "run_completed" for e in events)
    assert [(b["alert"]["name"], b["alert"]["severity"]) for b in hook.bodies] == [("run_completed", "info")]


def test_a_console_sink_records_its_deliveries_beside_a_webhook(tmp_path: Path, stdlib_python: str) -> None:
    """The supervisor prints these events on its own console: the console sink counts them
    delivered (before, it was dropped from the router and never appeared in an alert event)."""
    hook = Hook()
    try:
        events = _supervise(
            tmp_path, stdlib_python, hook, exit_code=3, config=CONFIG + "    - type: console\n"
        )
    finally:
        hook.close()
    alerts = [e for e in events if e.kind == "alert"]
    assert [e.name for e in alerts] == ["restart", "restart", "run_failed"]
    assert all(sorted(e.data["delivered"]) == ["console", "webhook"] for e in alerts)


def test_a_console_sink_alone_still_records_every_alert(tmp_path: Path, stdlib_python: str) -> None:
    hook = Hook()
    only_console = CONFIG.split("alerts:")[0] + "alerts:\n  sinks:\n    - type: console\n"
    try:
        events = _supervise(tmp_path, stdlib_python, hook, exit_code=3, config=only_console)
    finally:
        hook.close()
    alerts = [e for e in events if e.kind == "alert"]
    assert [(e.name, e.data["status"], e.data["delivered"]) for e in alerts] == [
        ("restart", "delivered", ["console"]),
        ("restart", "delivered", ["console"]),
        ("run_failed", "delivered", ["console"]),
    ]
    assert hook.bodies == []

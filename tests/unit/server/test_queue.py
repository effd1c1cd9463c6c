"""The durable queue: ids in order, moves only from allowed states, state kept across reopen."""

from __future__ import annotations

from pathlib import Path

import pytest

from steadytune.server.queue import JobQueue, QueueError


def spec() -> dict:
    return {"kind": "supervise", "cmd": ["true"], "label": "t"}


def test_jobs_get_ids_in_submission_order_and_survive_a_reopen(tmp_path: Path):
    q = JobQueue(tmp_path / "q.db", clock=lambda: 100.0)
    a = q.submit(spec(), 10, "user")
    b = q.submit(spec(), 20, "estimate", gpus=2, priority=3, user="ana")
    assert (a.id, b.id) == ("j1", "j2")
    assert q.move("j1", "admitted", gpus=[0], run_dir="/r/j1")
    q.close()
    q2 = JobQueue(tmp_path / "q.db")
    jobs = q2.jobs()
    assert [(j.id, j.state, j.gpus) for j in jobs] == [("j1", "admitted", (0,)), ("j2", "queued", ())]
    assert jobs[1].priority == 3 and jobs[1].gpus_wanted == 2 and jobs[1].user == "ana"
    assert jobs[0].submitted_ts == 100.0 and jobs[0].spec == spec()


def test_moves_only_from_allowed_states(tmp_path: Path):
    q = JobQueue(tmp_path / "q.db")
    q.submit(spec(), 10, "user")
    assert not q.move("j1", "running")  # queued → running skips admission
    assert not q.move("j1", "done")
    assert q.move("j1", "held")
    assert not q.move("j1", "admitted")  # a held job is not admitted
    assert q.move("j1", "queued")
    assert q.move("j1", "admitted") and q.move("j1", "running", pid=42)
    assert not q.move("j1", "held")
    assert q.move("j1", "done")
    assert not q.move("j1", "cancelled")  # final
    assert q.get("j1").state == "done" and q.get("j1").pid == 42


def test_bad_requests_are_named(tmp_path: Path):
    q = JobQueue(tmp_path / "q.db")
    with pytest.raises(QueueError, match="gpus=0"):
        q.submit(spec(), 10, "user", gpus=0)
    q.submit(spec(), 10, "user")
    with pytest.raises(QueueError, match="unknown state 'paused'"):
        q.move("j1", "paused")
    with pytest.raises(QueueError, match="cannot set 'state'"):
        q.move("j1", "held", state="done")


def test_the_environment_is_kept_private(tmp_path: Path):
    q = JobQueue(tmp_path / "srv" / "q.db")
    job = q.submit({**spec(), "env": {"HF_TOKEN": "hf_secret"}}, 10, "user")
    assert q.get(job.id).spec["env"] == {"HF_TOKEN": "hf_secret"}  # the job gets it...
    assert "env" not in job.to_dict()["spec"]  # ...the API does not show it
    assert oct((tmp_path / "srv" / "q.db").stat().st_mode & 0o777) == "0o600"

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


def test_the_queue_and_its_wal_and_shm_are_private_in_a_shared_directory(tmp_path: Path) -> None:
    """Jobs' environments (tokens) live in these files: 0644 WAL/SHM let another user read them."""
    import os
    import stat

    shared = tmp_path / "srv"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    old = os.umask(0o022)
    try:
        q = JobQueue(shared / "queue.db")
        assert q.notes and "was mode 755" in q.notes[0] and "made 700" in q.notes[0]
        q.submit({**spec(), "env": {"HF_TOKEN": "hf_" + "x" * 30}}, 10, "user")
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in shared.iterdir()}
        q.close()
    finally:
        os.umask(old)
    assert {"queue.db", "queue.db-wal", "queue.db-shm"} <= modes.keys()
    assert all(m & 0o077 == 0 for m in modes.values()), modes
    assert stat.S_IMODE(shared.stat().st_mode) == 0o700


def test_a_server_folder_that_is_a_link_or_of_another_user_is_refused(tmp_path: Path) -> None:
    import os

    from steadytune.secretfile import InsecureDirectory, private_dir

    (tmp_path / "mine").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "mine", target_is_directory=True)
    with pytest.raises(InsecureDirectory, match="not a folder"):
        JobQueue(link / "queue.db")
    if os.getuid() != 0:
        pytest.skip("making a folder another user owns needs root")
    other = tmp_path / "theirs"
    other.mkdir(mode=0o700)
    os.chown(other, 4321, 4321)
    with pytest.raises(InsecureDirectory, match="belongs to another user"):
        private_dir(other, "the server's folder")

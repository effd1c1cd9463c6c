"""A ``run.db`` that is not a database (a co-writer's garbage, a damaged disk) is one clear line
naming the file and the fix, in ``compact`` and in the dashboard's log, never a traceback."""

from __future__ import annotations

import io
import json
import logging
import os
import sqlite3
import time
from pathlib import Path

import pytest

from steadytune.cli.main import main as cli
from steadytune.rundir import RunDir
from steadytune.telemetry.store.schema import StoreBase, UnreadableIndex
from steadytune.web.warm import serve_reads


def _garbage_run(root: Path) -> RunDir:
    run = RunDir(root / "runs" / "X").create()
    run.db.write_bytes(os.urandom(131_072))
    run.status.write_text(json.dumps({"state": "completed", "updated_ts": time.time()}))
    return run


@pytest.mark.parametrize("readonly", [False, True])
def test_opening_it_names_the_file_and_the_fix(tmp_path: Path, readonly: bool) -> None:
    run = _garbage_run(tmp_path)
    with pytest.raises(UnreadableIndex) as caught:
        StoreBase(run.db, readonly=readonly)
    assert isinstance(caught.value, sqlite3.DatabaseError)  # what caught that still catches it
    assert str(run.db) in str(caught.value) and "move it aside" in str(caught.value)


def test_compact_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _garbage_run(tmp_path)
    assert cli(["compact", str(run.root)]) == 1
    err = capsys.readouterr().err
    assert str(run.db) in err and "not a readable index" in err and "Traceback" not in err


def test_the_dashboard_rebuilds_a_finished_runs_index_and_keeps_the_unreadable_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The run was shown "unreadable", with no page, until someone moved the file aside by hand.
    run = _garbage_run(tmp_path)
    garbage = run.db.read_bytes()
    (run.root / "events.jsonl").write_text(
        json.dumps({"ts": 1.0, "kind": "lifecycle", "name": "run_started", "message": "run X started"}) + "\n"
    )
    out = io.StringIO()
    with caplog.at_level(logging.INFO):
        serve_reads(run.root.parent, tmp_path / "cache", io.StringIO("X\n"), out)
    assert out.getvalue() == "read X\n"
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and said[0].exc_info is None
    assert str(run.db) in said[0].getMessage() and "rebuilt" in said[0].getMessage()
    assert (run.root / "run.db.unreadable").read_bytes() == garbage
    store = StoreBase(run.db, readonly=True)  # the new index opens
    try:
        assert store.get_meta("indexer") == "dashboard"
    finally:
        store.close()


def test_a_live_runs_unreadable_index_is_left_to_its_supervisor(tmp_path: Path) -> None:
    run = _garbage_run(tmp_path)
    garbage = run.db.read_bytes()
    run.status.write_text(
        json.dumps({"state": "running", "updated_ts": time.time(), "supervisor_pid": os.getpid()})
    )
    out = io.StringIO()
    serve_reads(run.root.parent, tmp_path / "cache", io.StringIO("X\n"), out)
    assert run.db.read_bytes() == garbage and not (run.root / "run.db.unreadable").exists()
    assert (tmp_path / "cache" / "X.db").exists()  # indexed apart, in the dashboard's own cache

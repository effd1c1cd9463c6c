"""The loader: a run directory read into the history the account takes, incrementally, and cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.goodput.account import account
from steadytune.goodput.load import AccountCache, HistoryReader, run_account
from steadytune.records import Heartbeat
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.stream import JsonlWriter

from .history import Run


def built() -> Run:
    run = Run().plan(0, "start").event("run_started").launch(0, "startup")
    for n in range(1, 6):
        run.step(n, 0)
        run.beat("save", 0).spend("save", 6.0).beat("save", 0).spend("save", 6.0).beat(
            "train", 0
        )  # a slow save beats
    return run.exit(0, "completed").spend("shutdown", 1.0).event("run_completed")


def write(root: Path, run: Run, state: str = "completed", updated: float = 0.0) -> RunDir:
    rd = RunDir(root).create()
    for path, records in ((rd.plan, run.plans), (rd.telemetry(0), run.stream), (rd.events, run.events)):
        with JsonlWriter(path) as w:
            for rec in records:
                w.write(rec)
    atomic_write_text(rd.status, json.dumps({"state": state, "updated_ts": updated}))
    return rd


def test_the_folder_gives_the_account_of_its_records(tmp_path: Path) -> None:
    run = built()
    rd = write(tmp_path / "r", run)
    history = HistoryReader(rd).read()
    # Each of the five slow saves beat twice in its phase: the second beat is dropped, nothing else.
    assert len(history.stream) == len(run.stream) - 5
    assert run_account(rd).seconds == account(run.history()).seconds
    assert run_account(rd).seconds["save"] == pytest.approx(5 * 12.0)


def test_a_reader_reads_only_what_was_appended(tmp_path: Path) -> None:
    run = built()
    rd = write(tmp_path / "r", run)
    reader = HistoryReader(rd)
    first = reader.read()
    assert reader.read() == first  # nothing new
    with JsonlWriter(rd.telemetry(0)) as w:
        w.write(Heartbeat(ts=run.t + 1, attempt=0, phase="setup"))
    assert len(reader.read().stream) == len(first.stream) + 1


def test_a_finished_run_is_computed_again_only_when_it_grows(tmp_path: Path) -> None:
    rd = write(tmp_path / "r", built())
    cache = AccountCache(clock=lambda: 10.0)
    once = cache.account(rd)
    assert cache.account(rd) is once
    with JsonlWriter(rd.events) as w:
        w.write(built().events[-1])  # a second end: the account is read again
    assert cache.account(rd) is not once


def test_a_live_run_is_counted_up_to_the_reading(tmp_path: Path) -> None:
    run = Run().plan(0, "start").event("run_started").launch(0, "startup")
    for n in range(1, 4):
        run.step(n, 0)
    now = [run.t + 0.5]
    rd = write(tmp_path / "r", run, state="running", updated=now[0])
    cache = AccountCache(clock=lambda: now[0])
    live = cache.account(rd)
    assert not live.ended and live.end_ts == now[0]
    now[0] += 2.0  # past the reuse window of a cheap account: counted up to the new reading
    atomic_write_text(rd.status, json.dumps({"state": "running", "updated_ts": now[0]}))
    assert cache.account(rd).end_ts == now[0]

"""Folders named for their owner: swept when the owner is gone, a reused pid included."""

from __future__ import annotations

import itertools
import os
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import steadytune.scratch as scratch
from steadytune.scratch import namespace, owned_tempdir, owned_tempdir_for, remove_own, started, sweep

PREFIX = "steadytune-test-"


def fake_proc(root: Path, pid: int, start: int) -> Path:
    """A ``/proc`` holding one process whose name has the spaces and parentheses a name may have."""
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    fields = ["S", "1", *["0"] * 17, str(start), "0"]
    (root / str(pid) / "stat").write_text(f"{pid} (a (b) c) {' '.join(fields)}\n")
    (root / "self" / "ns").mkdir(parents=True, exist_ok=True)
    (root / "self" / "ns" / "pid").touch()
    return root


def test_the_start_time_is_read_after_the_name(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", 42, 123456)
    assert started(42, proc) == "123456"
    assert started(43, proc) is None


def test_a_folder_is_swept_when_its_pid_is_gone_or_now_another_process(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", 42, 1000)
    where = tmp_path / "tmp"
    where.mkdir()
    ns = namespace(proc)
    alive = where / f"{PREFIX}42-1000-{ns}-abc"
    reused = where / f"{PREFIX}42-999-{ns}-def"  # pid 42 now belongs to a process started later
    dead = where / f"{PREFIX}77-1000-{ns}-ghi"
    elsewhere = where / f"{PREFIX}77-1000-{int(ns) + 1}-jkl"  # another container's pid 77: not ours to judge
    other = where / f"{PREFIX}not-ours"
    for d in (alive, reused, dead, elsewhere, other):
        d.mkdir()
    (dead / "copy.log").write_text("x")
    assert sorted(sweep(PREFIX, where, proc)) == sorted([reused, dead])
    assert sorted(where.iterdir()) == sorted([alive, elsewhere, other])


def test_this_process_folder_survives_a_sweep(tmp_path: Path) -> None:
    mine = owned_tempdir(PREFIX, tmp_path)
    assert mine.name.startswith(f"{PREFIX}{os.getpid()}-")
    assert sweep(PREFIX, tmp_path) == []
    assert mine.is_dir()


def test_a_pid_too_large_for_the_system_names_no_owner_where_proc_is_absent(tmp_path: Path) -> None:
    """Without ``/proc`` the pid is looked up with ``kill(pid, 0)``, which a pid past a C long made
    raise ``OverflowError``: one such folder name ended every later sweep, and the command with it."""
    where = tmp_path / "tmp"
    where.mkdir()
    huge = where / f"{PREFIX}{10**20}-x-x-abc"
    huge.mkdir()
    assert sweep(PREFIX, where, tmp_path / "no-proc") == [huge]
    assert not huge.exists()


def test_a_sweep_removes_only_its_own_folders_never_what_a_link_in_one_names(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", 42, 1000)
    ns = namespace(proc)
    where, outside = tmp_path / "tmp", tmp_path / "outside"
    where.mkdir()
    outside.mkdir()
    (outside / "keep").write_text("x")
    dead = where / f"{PREFIX}77-1000-{ns}-abc"
    dead.mkdir()
    (dead / "dir").symlink_to(outside)
    (dead / "file").symlink_to(outside / "keep")
    (where / f"{PREFIX}78-1000-{ns}-link").symlink_to(outside)  # a link in the folder's place
    (where / f"{PREFIX}79-1000-{ns}-file").write_text("x")  # a file in the folder's place
    assert sweep(PREFIX, where, proc) == [dead]
    assert sorted(p.name for p in outside.iterdir()) == ["keep"]
    left = [f"{PREFIX}78-1000-{ns}-link", f"{PREFIX}79-1000-{ns}-file"]
    assert sorted(p.name for p in where.iterdir()) == left


def test_a_sweep_of_a_crowded_temporary_folder_holds_none_of_its_entries(tmp_path: Path) -> None:
    """Anyone can fill a shared /tmp: a sweep walks it and keeps only the folders it removes."""
    where = tmp_path / "tmp"
    where.mkdir()
    crowd = 30_000
    for i in range(crowd):
        os.close(os.open(where / f"someone-else-{i:06d}", os.O_CREAT | os.O_WRONLY, 0o600))
    sweep(PREFIX, where)  # once, so what the first sweep imports is not counted below
    tracemalloc.start()
    try:
        assert sweep(PREFIX, where) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 * crowd, f"held {peak:,} bytes walking {crowd:,} entries"  # under 10 bytes an entry


class _Stop(BaseException):
    """What the ``steadytune`` command raises on SIGTERM (``cli.main.Terminated``), between two lines."""


@contextmanager
def _stop_at_line(n: int) -> Iterator[None]:
    """Raise :class:`_Stop` at the ``n``-th line run in ``scratch.py`` (0 the first), as a signal
    handler raises where the code is. Its own lines only: a stop inside the standard library's
    locks would hang the next call, which a process that is exiting never makes."""
    seen = [0]
    previous = sys.gettrace()

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != scratch.__file__:
            return None
        if event == "line":
            if seen[0] == n:
                raise _Stop
            seen[0] += 1
        return trace

    sys.settrace(trace)
    try:
        yield
    finally:
        sys.settrace(previous)


def _in_a_with(where: Path) -> Path:
    with owned_tempdir_for(PREFIX, where) as made:
        return made


@pytest.mark.parametrize(
    "make", [_in_a_with, lambda where: owned_tempdir(PREFIX, where)], ids=["with", "plain"]
)
def test_a_stop_at_any_line_of_the_making_leaves_no_folder_once_the_process_exits(
    tmp_path: Path, make: Callable[[Path], Path]
) -> None:
    """SIGTERM once the folder existed, before the ``try`` meant to remove it (or within its clean-up),
    left it behind for good: a terminated dashboard its cache, a terminated ``analyze`` its copy.
    Whatever was made is removed as the process exits, wherever the stop came."""
    for n in itertools.count():
        try:
            with _stop_at_line(n):
                made = make(tmp_path)
        except _Stop:
            remove_own()  # what the process does as it exits
            assert list(tmp_path.iterdir()) == [], f"left by a stop at line {n}"
            continue
        break  # no line left to stop at: made whole
    left = [made] if made.exists() else []  # a plain one is the caller's to remove; a with's is gone
    assert n > 5 and remove_own() == left and list(tmp_path.iterdir()) == []


def test_a_forked_child_leaves_its_parents_folders_at_its_exit(tmp_path: Path) -> None:
    mine = owned_tempdir(PREFIX, tmp_path)
    pid = os.fork()
    if pid == 0:  # the child: what it runs at its exit
        os._exit(len(remove_own()))
    _, code = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(code) == 0 and mine.is_dir()
    assert remove_own() == [mine]

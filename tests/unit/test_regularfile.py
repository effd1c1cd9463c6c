"""The one opener of run-folder files refuses, without waiting, anything but a regular file."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from steadytune.regularfile import FileTooLarge, NotRegularFile, open_regular, read_bytes, read_text


def test_a_fifo_is_refused_at_once_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    os.mkfifo(path)
    with pytest.raises(NotRegularFile) as caught:
        read_text(path)  # no writer ever comes: a plain open() waited here for good
    assert caught.value.filename == str(path) and caught.value.strerror == "a FIFO, not a regular file"
    assert isinstance(caught.value, OSError)  # every reader's "cannot be read" path takes it


def test_a_link_to_a_device_is_refused_and_a_link_to_a_file_followed(tmp_path: Path) -> None:
    zero, real, good = tmp_path / "events.jsonl", tmp_path / "real.json", tmp_path / "good.json"
    zero.symlink_to("/dev/zero")
    real.write_text('{"a": 1}')
    good.symlink_to(real)
    with pytest.raises(NotRegularFile, match="a character device"):
        read_bytes(zero)
    assert read_text(good) == '{"a": 1}'
    with pytest.raises(OSError):  # ELOOP: a link is not followed where the reader says so
        read_text(good, follow=False)


def test_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotRegularFile, match="a folder"):
        open_regular(tmp_path)


def test_a_whole_file_read_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(b"x" * 101)
    assert read_bytes(path, limit=101) == b"x" * 101
    with pytest.raises(FileTooLarge):
        read_bytes(path, limit=100)


def test_the_file_returned_blocks_as_open_makes_it(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    path.write_text("line\n")
    with open_regular(path, "r", encoding="utf-8") as f:
        assert os.get_blocking(f.fileno())  # O_NONBLOCK was cleared
        assert f.read() == "line\n"
    with pytest.raises(ValueError):
        open_regular(path, "w")


def test_a_fifo_where_a_checkpoints_weights_belong_is_a_problem_not_a_wait(tmp_path: Path) -> None:
    from steadytune.checkpoint.external import safetensors_problem
    from steadytune.forensics.stread import read_header

    weights = tmp_path / "model.safetensors"
    os.mkfifo(weights)
    assert safetensors_problem(weights) == "model.safetensors: unreadable header (NotRegularFile)"
    with pytest.raises(NotRegularFile):
        read_header(weights)


def _within(seconds: float, call: Callable[[], object]) -> BaseException | None:
    """What ``call`` raised, run on a thread that may not come back: a hang is a failure, not a wait."""
    import threading

    got: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            got.append(None)
        except BaseException as e:
            got.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert got, f"still blocked after {seconds} s"
    return got[0]


@pytest.mark.parametrize("reader", [False, True], ids=["no reader", "a reader holds it"])
def test_a_fifo_where_a_log_is_appended_is_refused_at_once(tmp_path: Path, reader: bool) -> None:
    """events.jsonl or a telemetry stream swapped for a FIFO by a co-writer: a plain open() to append
    waited for a reader for good (the supervisor with it) or wrote into the pipe."""
    from steadytune.telemetry.events import EventLog
    from steadytune.telemetry.stream import JsonlWriter

    events, stream = tmp_path / "events.jsonl", tmp_path / "rank-0.jsonl"
    log = EventLog(events, run_id="r")
    log.emit("lifecycle", "run_started")
    events.unlink()
    os.mkfifo(events)
    os.mkfifo(stream)
    held = [os.open(p, os.O_RDONLY | os.O_NONBLOCK) for p in (events, stream)] if reader else []
    try:
        for call in (lambda: log.emit("lifecycle", "run_completed"), lambda: JsonlWriter(stream)):
            err = _within(10.0, call)
            assert isinstance(err, NotRegularFile) and "not a regular file" in str(err), err
    finally:
        for fd in held:
            os.close(fd)


def test_an_empty_file_and_one_at_the_bound_are_read_whole(tmp_path: Path) -> None:
    empty, full = tmp_path / "empty.json", tmp_path / "full.bin"
    empty.write_bytes(b"")
    full.write_bytes(b"x" * 4096)
    assert read_bytes(empty) == b"" and read_text(empty) == ""
    assert read_bytes(full, limit=4096) == b"x" * 4096
    with pytest.raises(FileTooLarge):
        read_bytes(full, limit=4095)

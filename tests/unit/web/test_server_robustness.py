"""The dashboard survives what a run directory may hold, and its live stream sends each event once.

The server runs on 127.0.0.1 with a free port, a short poll interval and a
bounded read of each stream.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.waiting import ANSWER_S, wait_for

from steadytune.records import Event, StepRecord, WorkerExit
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.store import RunStore
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web.server import DashboardHandle, start_dashboard

DEEP = "[" * 100_000  # one line of nothing but open brackets: json.loads raises RecursionError
# Parseable, but too deep for what walks it next (to_dict, json.dumps, the API's clean()).
NESTED = "[" * 900 + "]" * 900


def get(handle: DashboardHandle, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", handle.port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


Frame = tuple[str, Any]


class Stream:
    """A live stream read as it comes: its (event, data) frames in :attr:`frames`, waited on by
    what they hold, never for a fixed time (a loaded machine serves the first frame late)."""

    def __init__(self, handle: DashboardHandle, path: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", handle.port), timeout=5)
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{handle.port}\r\n\r\n".encode())
        self.sock.settimeout(0.1)
        self.frames: list[Frame] = []
        self.ended = False
        self._head: bytes | None = None
        self._buf = b""

    def _read(self) -> None:
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return
        if not chunk:
            self.ended = True
        self._buf += chunk
        if self._head is None:
            if b"\r\n\r\n" not in self._buf:
                return
            self._head, _, self._buf = self._buf.partition(b"\r\n\r\n")
            assert self._head.startswith(b"HTTP/1.1 200"), self._head[:200]
        *whole, self._buf = self._buf.split(b"\n\n")
        for frame in whole:
            text = frame.decode()
            lines = dict(ln.split(": ", 1) for ln in text.split("\n") if ": " in ln and ln[0] != ":")
            if "event" in lines:
                self.frames.append((lines["event"], json.loads(lines["data"])))

    def until(self, done: Callable[[list[Frame]], bool], what: str, timeout: float = 60.0) -> list[Frame]:
        """The frames so far, once ``done(frames)`` holds (the timeout is only a backstop)."""
        deadline = time.monotonic() + timeout
        while not done(self.frames):
            assert not self.ended, f"the stream ended before {what}: {self.frames}"
            assert time.monotonic() < deadline, (
                f"timed out after {timeout:g} s waiting for {what}: {self.frames}"
            )
            self._read()
        return self.frames

    def more(self, seconds: float) -> list[Frame]:
        """The frames after ``seconds`` more of reading: what the server sends once it has nothing new
        (a frame sent again shows here; a slow machine looks fewer times, it never fails for it)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.ended:
            self._read()
        return self.frames

    def close(self) -> None:
        self.sock.close()


def events(frames: list[Frame]) -> list[dict[str, Any]]:
    """The events of a run's stream, in the order sent."""
    return [e for name, data in frames if name == "events" for e in data]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    handles: list[DashboardHandle] = []

    def start(runs: Path) -> DashboardHandle:
        handles.append(start_dashboard(runs, host="127.0.0.1", port=0, poll_s=0.05))
        return handles[-1]

    yield start
    for h in handles:
        h.stop()


def finished_run(runs: Path, run_id: str = "done") -> tuple[RunDir, list[Event]]:
    """A run as the supervisor leaves it: the worker's notices in telemetry/ (no seq), filed in
    events.jsonl."""
    run = RunDir(runs / run_id).create()
    log = EventLog(run.events, run_id=run_id)
    filed = [log.emit("lifecycle", "started", "run started")]
    with JsonlWriter(run.telemetry(0)) as w:
        w.write(Event(ts=10.0, kind="lifecycle", name="train_begin", data={"max_steps": 4}))
        for s in range(4):
            w.write(StepRecord(step=s, ts=11.0 + s, loss=2.0 - s / 10))
            if s == 2:
                notice = Event(ts=13.5, kind="action", name="checkpoint_saved", step=2, data={"rank": 0})
                w.write(notice)
                filed.append(log.append(notice))
        w.write(WorkerExit(ts=20.0, step=3))
    filed.append(log.emit("lifecycle", "completed", "run completed"))
    status = {"run_id": run_id, "state": "completed", "step": 3, "max_steps": 4, "updated_ts": 1000.0}
    atomic_write_text(run.status, json.dumps(status))
    return run, filed


def supervisor_index(run: RunDir, filed: list[Event]) -> None:
    """The index the supervisor leaves: its steps and the events it filed (the worker's own copies never)."""
    store = RunStore(run.db)
    store.add_steps([StepRecord(step=s, ts=11.0 + s, loss=2.0 - s / 10) for s in range(4)])
    store.add_events(filed)
    store.close()


@pytest.mark.parametrize("indexed_by", ["dashboard", "supervisor"])
def test_finished_run_stream_sends_each_event_once(serve, tmp_path: Path, indexed_by: str) -> None:
    runs = tmp_path / "runs"
    run, filed = finished_run(runs)
    if indexed_by == "supervisor":
        supervisor_index(run, filed)
    handle = serve(runs)
    status, _ = get(
        handle, "/api/runs/done"
    )  # the first request opens (and for a finished run, syncs) the index
    assert status == 200
    wait_for(lambda: handle.app.index.get("done").store().step_count() == 4, what="the run's steps indexed")
    stream = Stream(handle, "/api/runs/done/stream?since=0&after=-1")
    try:
        stream.until(lambda f: len(events(f)) >= len(filed), what="every filed event")
        sent = events(stream.more(1.0))  # ~20 more polls unloaded: none may send an event again
    finally:
        stream.close()
    assert all(isinstance(e.get("seq"), int) for e in sent), sent
    keys = [(e["kind"], e["name"], e["ts"]) for e in sent]
    assert len(keys) == len(set(keys)), f"an event was sent more than once: {keys}"
    # The worker's notices were filed by the supervisor: each shows once, as filed (with its seq).
    assert sorted(e["seq"] for e in sent) == [e.seq for e in filed]
    # The page's first load and the stream agree on seqs: nothing the stream sends after last_seq is old.
    status, body = get(handle, "/api/runs/done")
    detail = json.loads(body)
    assert [e["seq"] for e in detail["events"]] == [e.seq for e in filed] and detail["last_seq"] == filed[
        -1
    ].seq
    status, body = get(handle, f"/api/runs/done/events?after={filed[-1].seq}")
    assert json.loads(body) == []


def test_worker_notices_are_the_events_of_a_run_without_an_event_log(serve, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = RunDir(runs / "bare").create()
    with JsonlWriter(run.telemetry(0)) as w:
        w.write(StepRecord(step=0, ts=1.0, loss=1.0))
        w.write(Event(ts=2.0, kind="anomaly", name="loss_spike", severity="warning", step=0))
        w.write(Event(ts=3.0, kind="action", name="checkpoint_saved", step=0))
    handle = serve(runs)
    get(handle, "/api/runs/bare")
    stream = Stream(handle, "/api/runs/bare/stream?since=0&after=-1")
    try:
        stream.until(lambda f: len(events(f)) >= 2, what="both notices")
        sent = events(stream.more(0.5))
    finally:
        stream.close()
    assert [(e.get("seq"), e["name"]) for e in sent] == [(0, "loss_spike"), (1, "checkpoint_saved")]


def test_a_deeply_nested_line_is_skipped_and_counted(serve, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = RunDir(runs / "deep").create()
    with open(run.telemetry(0), "w") as f:
        f.write(json.dumps({"type": "step", "step": 0, "ts": 1.0, "loss": 1.0}) + "\n")
        f.write(DEEP + "\n")
        f.write('{"type": "step", "step": 5, "ts": 1.5, "loss": 1.0, "extra": {"x": ' + NESTED + "}}\n")
        f.write(json.dumps({"type": "step", "step": 1, "ts": 2.0, "loss": 0.9}) + "\n")
    with open(run.events, "w") as f:
        f.write(DEEP + "\n")
    atomic_write_text(run.status, '{"state": "running", "x": ' + NESTED + "}")
    handle = serve(runs)
    status, body = get(handle, "/api/runs/deep")
    assert status == 200, body[:300]
    entry = handle.app.index.get("deep")
    wait_for(lambda: entry.store().step_count() >= 2, what="the lines around it indexed")
    assert entry.store().step_count() == 2  # the lines around it are indexed, and nothing else
    detail = json.loads(get(handle, "/api/runs/deep")[1])
    assert detail["unreadable_lines"] == 3  # two in telemetry/rank-0.jsonl, one in events.jsonl
    status, body = get(handle, "/api/runs/deep/series?points=100")
    assert status == 200 and json.loads(body)["steps"]["total"] == 2
    assert get(handle, "/api/runs")[0] == 200
    assert get(handle, "/metrics")[0] == 200


def test_a_deep_last_line_does_not_stop_adopting_the_supervisors_index(serve, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run, filed = finished_run(runs, "tail")
    supervisor_index(run, filed)
    with open(run.events, "a") as f:
        f.write(DEEP + "\n")
    handle = serve(runs)
    status, body = get(handle, "/api/runs/tail")
    assert status == 200, body[:300]
    assert [e["seq"] for e in json.loads(body)["events"]] == [e.seq for e in filed]


def _raw(handle: DashboardHandle, data: bytes, wait_s: float = 3.0) -> bytes:
    """What the server answers to ``data`` within ``wait_s`` (the request may be unfinished)."""
    sock = socket.create_connection(("127.0.0.1", handle.port), timeout=wait_s)
    try:
        try:
            sock.sendall(data)
        except OSError:
            pass  # the server may answer and close before it has read everything
        buf = b""
        try:
            while b"\r\n\r\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return buf
    finally:
        sock.close()


def test_request_header_bytes_are_capped_before_auth(serve, tmp_path: Path) -> None:
    """60 connections of 99 headers of 64 KB, never finished, took the dashboard from 42 to 420 MB:
    the server read every header before answering anything."""
    (tmp_path / "runs").mkdir()
    h = serve(tmp_path / "runs")
    head = f"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1:{h.port}\r\n".encode()
    answer = _raw(h, head + b"".join(f"X-Pad-{i}: {'a' * 60_000}\r\n".encode() for i in range(5)))
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"NONSENSE\r\n\r\n", b"400"),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", b"414"),
        (b"GET / HTTP/1.1\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n", b"431"),
        (b"BREW / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"501"),
    ],
    ids=["400", "414", "431", "501"],
)
def test_the_standard_librarys_error_pages_carry_the_security_headers(
    serve, tmp_path: Path, request_bytes: bytes, status: bytes
) -> None:
    (tmp_path / "runs").mkdir()
    h = serve(tmp_path / "runs")
    answer = _raw(h, request_bytes)
    assert answer.split(b" ", 2)[1] == status, answer[:300]
    head = answer.split(b"\r\n\r\n")[0].lower()
    for name in (b"content-security-policy", b"x-frame-options: deny", b"x-content-type-options: nosniff"):
        assert name in head, (name, answer[:500])


def test_every_route_of_the_table_is_guarded_as_it_says(tmp_path: Path) -> None:
    """Exposed, each READ and CONTROL route of the table answers 401 without the token, each OPEN
    one does not; a route added to the table is checked here without a line more."""
    from steadytune.web.auth import Access
    from steadytune.web.routes import ROUTES

    finished_run(tmp_path / "runs")
    token = "t" * 24
    h = start_dashboard(tmp_path / "runs", host="127.0.0.1", port=0, token=token, exposed=True)
    try:
        for route in ROUTES:
            path = route.path.format(run="done", name="common.js", job="j1", action="cancel")
            conn = http.client.HTTPConnection("127.0.0.1", h.port, timeout=ANSWER_S)
            body = b'{"confirm": true}' if route.method == "POST" else None
            conn.request(route.method, path + ("?step=1" if "gradhist" in path else ""), body=body)
            resp = conn.getresponse()
            if route.access is Access.OPEN:
                assert resp.status in (200, 404), (route.path, resp.status)  # /server: 404 without a server
            else:
                assert resp.status == 401, (route.path, resp.status)
            assert resp.getheader("X-Frame-Options") == "DENY"
            resp.read()
            conn.close()
    finally:
        h.stop()


def test_the_runs_stream_sends_the_list_once_then_only_the_rows_that_changed(serve, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for run, filed in (finished_run(runs, "still"), finished_run(runs, "moving")):
        supervisor_index(run, filed)  # indexed already: only the status below moves a row
    moving = RunDir(runs / "moving")
    handle = serve(runs)
    wait_for(lambda: not any(r.get("indexing") for r in json.loads(get(handle, "/api/runs")[1])),
             what="both runs read by the dashboard")  # fmt: skip

    def move() -> None:
        status = json.loads(moving.status.read_text())
        atomic_write_text(moving.status, json.dumps({**status, "state": "failed", "updated_ts": 1001.0}))

    stream = Stream(handle, "/api/stream")
    try:
        stream.until(lambda f: len(f) >= 1, what="the list")  # the list is sent before the run moves
        move()
        stream.until(lambda f: len(f) >= 2, what="the moved row")
        frames = stream.more(2.5)  # the stream looks again every second: nothing else is sent
    finally:
        stream.close()
    assert frames[0][0] == "runs" and [r["run_id"] for r in frames[0][1]] == ["moving", "still"]
    later = frames[1:]
    assert [name for name, _ in later] == ["runs_changed"], later
    assert [(r["run_id"], r["state"]) for r in later[0][1]] == [("moving", "failed")]

"""The worker/supervisor protocol: every event a worker emits is in WorkerEvent and has its handler on the
Supervisor; control requests are a queue that keeps back-to-back requests, in order, each read once."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest

import steadytune
from steadytune.guard.core import Guard
from steadytune.protocol import (
    COMMANDS,
    ControlError,
    RequestQueue,
    WorkerEvent,
    check_request,
    clear_requests,
    request_name,
    request_names,
    send_control,
    write_request,
)
from steadytune.records import Event
from steadytune.rundir import RunDir
from steadytune.supervise.worker_events import WorkerEvents
from steadytune.telemetry.events import read_events
from tests.unit.supervise.build import supervisor

SRC = Path(steadytune.__file__).parent
# Everything that writes worker events into a telemetry stream: the guard and the built-in trainer, the
# log adapter and command source of `supervise`, and the guard injected into other tools' trainers.
EMITTERS = [
    "guard",
    "train",
    "supervise/log_adapter.py",
    "supervise/command.py",
    "inject",
    "engines",
    "supervise/ray_source.py",
]


# -- worker events ---------------------------------------------------------------------------------------


def test_every_worker_event_has_its_handler_on_the_supervisor() -> None:
    for event in WorkerEvent:
        handler = getattr(WorkerEvents, event.handler, None)
        assert callable(handler), f"WorkerEvents has no {event.handler} for {event.value!r}"
        assert list(inspect.signature(handler).parameters) == ["self", "ev", "filed"], event


def test_every_command_has_its_acknowledgement() -> None:
    assert {WorkerEvent.ack(c) for c in COMMANDS} == {e for e in WorkerEvent if e.value.startswith("ack_")}
    with pytest.raises(ValueError):
        WorkerEvent.ack("reboot")


def _emitted_name(node: ast.Call) -> ast.expr | None:
    """The ``name`` argument of a ``.notify(kind, name, ...)`` or ``Event(..., name=...)`` call."""
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "notify":
        if len(node.args) >= 2:
            return node.args[1]
        return next((k.value for k in node.keywords if k.arg == "name"), None)
    if isinstance(func, ast.Name) and func.id == "Event":
        return next((k.value for k in node.keywords if k.arg == "name"), None)
    return None


def _resolve(expr: ast.expr) -> set[WorkerEvent] | str:
    """The events ``expr`` can name, or why it cannot be checked statically."""
    if (
        isinstance(expr, ast.Attribute)
        and isinstance(expr.value, ast.Name)
        and expr.value.id == "WorkerEvent"
    ):
        return (
            {WorkerEvent[expr.attr]}
            if expr.attr in WorkerEvent.__members__
            else f"no WorkerEvent.{expr.attr}"
        )
    if (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and expr.func.attr == "ack"
        and isinstance(expr.func.value, ast.Name)
        and expr.func.value.id == "WorkerEvent"
    ):
        return {WorkerEvent.ack(c) for c in COMMANDS}
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        known = WorkerEvent.get(expr.value)
        return {known} if known is not None else f"{expr.value!r} is not a WorkerEvent"
    return f"name {ast.unparse(expr)!r} cannot be checked: use a WorkerEvent member"


def emitted_events() -> tuple[set[WorkerEvent], list[str]]:
    """Every event the emitters can write, found in their source, and the call sites that name none."""
    found: set[WorkerEvent] = set()
    problems: list[str] = []
    files: list[Path] = []
    for part in EMITTERS:
        path = SRC / part
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else []
    for file in files:
        tree = ast.parse(file.read_text(encoding="utf-8"))
        notify_bodies = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef) and f.name == "notify"
            for n in ast.walk(f)
        }  # Guard.notify itself builds the Event from whatever name it was given
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or id(node) in notify_bodies:
                continue
            expr = _emitted_name(node)
            if expr is None:
                continue
            names = _resolve(expr)
            if isinstance(names, str):
                problems.append(f"{file.relative_to(SRC)}:{node.lineno}: {names}")
            else:
                found |= names
    return found, problems


def test_every_event_a_worker_emits_is_in_the_protocol_and_every_member_is_emitted() -> None:
    found, problems = emitted_events()
    assert problems == []
    assert found == set(WorkerEvent), f"never emitted: {sorted(set(WorkerEvent) - found)}"


def test_the_source_scan_can_fail() -> None:
    """The scan sees a name outside the protocol (else the test above proves nothing)."""
    call = ast.parse('guard.notify("action", "made_up_event", "x")').body[0].value  # type: ignore[attr-defined]
    assert _resolve(_emitted_name(call)) == "'made_up_event' is not a WorkerEvent"  # type: ignore[arg-type]
    call = ast.parse('guard.notify("action", f"ack_{c}")').body[0].value  # type: ignore[attr-defined]
    assert "cannot be checked" in _resolve(_emitted_name(call))  # type: ignore[arg-type,operator]


def test_worker_events_are_dispatched_by_name_and_unknown_ones_still_filed(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    sup.handle(Event(ts=1.0, kind="lifecycle", name="train_begin", data={"max_steps": 77}))
    sup.handle(Event(ts=2.0, kind="lifecycle", name="checkpoint_saved", step=10, data={"path": "x"}))
    sup.handle(Event(ts=3.0, kind="action", name="reduce_microbatch", step=11, data={"micro_batch_split": 4}))
    sup.handle(Event(ts=4.0, kind="lifecycle", name="something_new", message="from a newer worker"))
    assert sup.state.progress.max_steps == 77 and sup.state.history.checkpoint_steps == [10]
    assert (sup.state.plan.reason, sup.state.plan.micro_batch_split) == ("oom", 4)
    filed = [(e.name, e.step) for e in read_events(sup.run.events)]
    assert filed == [("checkpoint_saved", 10), ("reduce_microbatch", 11), ("something_new", None)]
    assert (
        sup.state.plan.cause_event_seq == read_events(sup.run.events)[1].seq
    )  # the revision names its cause


def test_an_acknowledged_checkpoint_after_a_leak_asks_for_the_allocator_snapshot(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    sup.state.leak_snapshot_pending = True
    sup.handle(Event(ts=1.0, kind="control", name="ack_checkpoint", data={"request_id": "r1"}))
    sup.handle(Event(ts=2.0, kind="control", name="ack_checkpoint", data={"request_id": "r2"}))
    (req,) = RequestQueue(sup.run.control).new()  # once, not at every checkpoint
    assert (req["command"], req["issuer"], req["attempt"]) == ("memory_snapshot", "policy:memory_leak", 0)


# -- the control queue -------------------------------------------------------------------------------------


class Clock:
    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def ids(*names: str):
    it = iter(names)
    return lambda: next(it)


def test_requests_sent_in_one_clock_tick_or_with_the_clock_stepped_back_keep_their_order(
    tmp_path: Path,
) -> None:
    run = RunDir(tmp_path / "r").create()
    clock = Clock(100.0, 100.0, 99.0, 101.5)
    new_id = ids("cc", "aa", "bb", "dd")
    for command in ("checkpoint", "checkpoint", "stop", "resume"):
        send_control(run, command, "alice (cli)", clock=clock, new_id=new_id)
    assert request_names(run.control) == [
        "00000000100000000000-cc.json",
        "00000000100000000001-aa.json",  # same tick: after the one before, whatever its id
        "00000000100000000002-bb.json",  # the clock went back: still after
        "00000000101500000000-dd.json",
    ]
    assert [r["id"] for r in RequestQueue(run.control).new()] == ["cc", "aa", "bb", "dd"]


def test_each_reader_gets_every_request_once_in_order_and_strays_are_skipped(tmp_path: Path) -> None:
    queue_dir = tmp_path / "control"
    first, second = RequestQueue(queue_dir), RequestQueue(queue_dir)
    assert first.new() == []  # no queue yet
    write_request(queue_dir, {"id": "a1", "command": "checkpoint", "ts": 1.0})
    write_request(queue_dir, {"id": "b2", "command": "stop", "ts": 2.0})
    (queue_dir / ".00000000003000000000-c3.json.x.tmp").write_text("{")  # a send in progress
    (queue_dir / "notes.txt").write_text("hi")
    (queue_dir / "00000000002500000000-ee.json").write_text("not json")
    assert [r["id"] for r in first.new()] == ["a1", "b2"]
    assert first.new() == []
    write_request(queue_dir, {"id": "c3", "command": "pause", "ts": 3.0})
    assert [r["id"] for r in first.new()] == ["c3"]
    assert [r["id"] for r in second.new()] == ["a1", "b2", "c3"]  # a second reader (another rank) sees all
    assert clear_requests(queue_dir) == 4 and request_names(queue_dir) == []
    assert (queue_dir / "notes.txt").exists()
    with pytest.raises(ValueError, match=r"request id '\.\./x' must be 1-64 letters and digits"):
        write_request(queue_dir, {"id": "../x", "command": "stop", "ts": 4.0})


def test_arguments_are_checked_per_command_and_all_problems_named_at_once() -> None:
    assert check_request("pause", {"mode": "hold"}) == {"mode": "hold"}
    assert check_request("pause", None) == {}
    with pytest.raises(ControlError) as err:
        check_request("pause", {"mode": "exit", "force": True})
    assert str(err.value) == (
        "pause mode='exit' is not one of release, hold: use one of those; "
        "pause takes mode, not 'force': remove force=True"
    )
    with pytest.raises(ControlError, match="stop takes no arguments, not 'mode': remove mode='hold'"):
        check_request("stop", {"mode": "hold"})
    with pytest.raises(ControlError, match="unknown control command 'reboot'; expected one of pause, resume"):
        check_request("reboot", None)


def test_the_guard_takes_back_to_back_requests_in_order_once_each(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r").create()
    guard = Guard(run.root, rank=0, attempt=1, clock=lambda: 5.0)
    assert guard.poll_control() is None
    clock = Clock(1.0, 1.0, 1.0, 1.0)
    send_control(run, "checkpoint", "policy:loss_spike", attempt=0, clock=clock, new_id=ids("old"))
    send_control(run, "checkpoint", "alice (dashboard, 127.0.0.1)", clock=clock, new_id=ids("c1"))
    send_control(run, "stop", "bob (cli)", clock=clock, new_id=ids("s1"))
    send_control(run, "checkpoint", "policy:memory_leak", attempt=1, clock=clock, new_id=ids("c2"))
    first = guard.poll_control()
    assert first is not None and first["id"] == "c1"  # the request for attempt 0 is dropped
    guard.put_back([first])  # held at a pause: handed out again, before anything newer
    got = [guard.poll_control() for _ in range(4)]
    assert [r and r["id"] for r in got] == ["c1", "s1", "c2", None]
    guard.close()


def test_the_supervisor_files_operator_requests_once_and_resumes_a_paused_run(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    send_control(sup.run, "checkpoint", "alice (dashboard, 127.0.0.1)", new_id=ids("a"))
    send_control(sup.run, "checkpoint", "policy:loss_spike", attempt=0, log=sup.out.events, new_id=ids("p"))
    send_control(sup.run, "resume", "bob (cli)", new_id=ids("r"))
    sup.controls.poll()
    sup.controls.poll()
    filed = [(e.name, e.data["issuer"], e.data["request_id"]) for e in read_events(sup.run.events)]
    assert filed == [
        ("checkpoint", "policy:loss_spike", "p"),  # filed by the supervisor when it sent it
        ("checkpoint", "alice (dashboard, 127.0.0.1)", "a"),
        ("resume", "bob (cli)", "r"),
    ]
    assert not sup.controls.resume_requested  # running, not paused: nothing to resume
    sup.state.status = "paused"
    send_control(sup.run, "resume", "bob (cli)", new_id=ids("r2"))
    sup.controls.poll()
    assert sup.controls.resume_requested


def test_a_new_worker_starts_on_an_empty_queue_and_what_was_queued_is_filed(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    send_control(sup.run, "pause", "alice (cli)", args={"mode": "hold"}, new_id=ids("late"))
    sup.controls.drop_stale_requests()
    assert request_names(sup.run.control) == []
    (event,) = read_events(sup.run.events)
    assert (event.name, event.data["request_id"], event.data["args"]) == ("pause", "late", {"mode": "hold"})


def test_the_cli_refuses_an_issuer_the_supervisor_owns(tmp_path: Path, monkeypatch, capsys) -> None:
    from steadytune.cli.main import main

    run = RunDir(tmp_path / "r").create()
    run.events.write_text("")
    monkeypatch.setenv("LOGNAME", "policy:me")
    assert main(["checkpoint", str(run.root), "--no-wait"]) == 2
    assert "'policy:me@" in capsys.readouterr().err and request_names(run.control) == []
    monkeypatch.setenv("LOGNAME", "ops")
    assert main(["pause", str(run.root), "--hold", "--no-wait"]) == 0
    (req,) = RequestQueue(run.control).new()
    assert (
        req["issuer"].startswith("ops@")
        and req["issuer"].endswith(" (cli)")
        and req["args"] == {"mode": "hold"}
    )
    assert json.loads((run.control / request_names(run.control)[0]).read_text()) == req


def _hostile(directory: Path, kind: str) -> str:
    """One file in the control queue that is not a request: what the supervisor must refuse."""
    import os

    name = request_name(1_000_000_000, kind.replace("_", ""))
    path = directory / name
    if kind == "deep":
        path.write_text("[" * 200_000)  # json.loads raised RecursionError: the supervisor died
    elif kind == "huge":
        path.write_text('{"command": "stop", "issuer": "x", "pad": "' + "a" * (4 << 20) + '"}')
    elif kind == "fifo":
        os.mkfifo(path)  # open() for reading waited for a writer: the supervisor hung
    elif kind == "symlink":
        target = directory.parent / "elsewhere.json"
        target.write_text(json.dumps({"id": "x", "command": "stop", "issuer": "eve", "ts": 1.0}))
        path.symlink_to(target)
    elif kind == "not_object":
        path.write_text("[1, 2, 3]")
    elif kind == "bad_command":
        path.write_text(json.dumps({"id": "x", "command": "reboot" * 50, "issuer": "eve", "ts": 1.0}))
    elif kind == "not_utf8":
        path.write_bytes(b'{"command": "\xff\xfe"}')
    elif kind == "folder":  # found by the fuzzing harness: IsADirectoryError
        path.mkdir()
    return name


@pytest.mark.parametrize(
    "kind", ["deep", "huge", "fifo", "symlink", "not_object", "bad_command", "not_utf8", "folder"]
)
def test_a_control_file_that_is_not_a_request_is_filed_as_refused_and_the_queue_goes_on(
    tmp_path: Path, kind: str
) -> None:
    import threading

    sup = supervisor(tmp_path)
    sup.run.control.mkdir(parents=True, exist_ok=True)
    name = _hostile(sup.run.control, kind)
    send_control(sup.run, "checkpoint", "alice (cli)", new_id=ids("ok"))
    failed: list[BaseException] = []

    def poll() -> None:
        try:
            sup.controls.poll()
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading the control queue blocked"
    assert failed == []
    filed = read_events(sup.run.events)
    refused = [e for e in filed if e.name == "request_refused"]
    assert len(refused) == 1 and name in refused[0].message and refused[0].severity == "warning"
    assert [e.data.get("request_id") for e in filed if e.name == "checkpoint"] == ["ok"]

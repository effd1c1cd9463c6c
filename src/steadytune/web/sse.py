"""The live streams (Server-Sent Events): what changed, pushed as it changes, until the viewer leaves.

``/api/stream`` sends the runs list; ``/api/runs/<id>/stream`` sends one run's status, new or
replaced steps, gradient flow, system samples, events, checkpoints and plans. A stream holds
one of the dashboard's ``max_streams`` slots (:func:`with_slot`) and ends as soon as its viewer
closes the connection, checked between sends rather than at the next write (up to 15 s away).
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from steadytune.web import api, runlist
from steadytune.web.app import DashboardApp
from steadytune.web.runs import RunEntry

KEEP_ALIVE_S = 15.0


class Writable(Protocol):
    def write(self, data: bytes, /) -> int: ...

    def flush(self) -> None: ...


class EventStream:
    """One open stream: events written to ``out``, the viewer's end watched on ``conn``."""

    def __init__(self, out: Writable, conn: socket.socket) -> None:
        self.out, self.conn = out, conn
        self._beat = time.monotonic()

    def begin(self) -> None:
        self.out.write(b"retry: 1000\n\n")
        self.out.flush()

    def send(self, event: str, data: Any) -> None:
        payload = json.dumps(data, separators=(",", ":"), allow_nan=False)
        self.out.write(f"event: {event}\ndata: {payload}\n\n".encode())

    def flush(self, sent: bool) -> None:
        """Flush what was sent, or a keep-alive comment once the stream has been quiet a while."""
        if sent:
            self.out.flush()
            self._beat = time.monotonic()
        elif time.monotonic() - self._beat > KEEP_ALIVE_S:
            self.out.write(b": keep-alive\n\n")
            self.out.flush()
            self._beat = time.monotonic()

    def viewer_gone(self) -> bool:
        """The viewer closed its end."""
        try:
            if hasattr(select, "poll"):
                poller = select.poll()
                poller.register(self.conn, select.POLLIN)
                if not poller.poll(0):
                    return False
            elif not select.select([self.conn], [], [], 0)[0]:
                return False
            return not self.conn.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return False
        except (OSError, ValueError):
            return True


def with_slot(app: DashboardApp, body: Callable[[], None], busy: Callable[[], None]) -> None:
    """Run one stream if a slot is free (at most ``max_streams`` at once), else ``busy()``."""
    if not app.streams.acquire(blocking=False):
        busy()
        return
    try:
        body()
    finally:
        app.streams.release()


def runs(app: DashboardApp, stream: EventStream, query: runlist.RunQuery | None = None) -> None:
    """The runs list (``runs``) first and whenever a run comes or goes; else only the rows that
    changed (``runs_changed``): with a thousand runs and one live, the page redrew a thousand rows
    from 750 KB every second for the one that moved.

    With ``query``, the one page of it (:func:`.runlist.select`): ``runs`` carries the page and its
    counts, sent again when the rows shown or the counts change (a run came, was read, or moved
    into or out of the page), else ``runs_changed`` the shown rows that changed.
    """
    last: list[dict[str, Any]] | None = None
    counts: dict[str, Any] | None = None
    while not app.stopping.is_set() and not stream.viewer_gone():
        rows = api.runs_list(app.index)
        page = runlist.select(rows, query) if query is not None else None
        if page is not None:
            rows = page.pop("runs")
        sent = rows != last or page != counts
        if last is None or [r["run_id"] for r in rows] != [r["run_id"] for r in last] or page != counts:
            stream.send("runs", rows if page is None else {**page, "runs": rows})
        elif sent:
            stream.send("runs_changed", [r for r, was in zip(rows, last, strict=True) if r != was])
        last, counts = rows, page
        stream.flush(sent)
        app.stopping.wait(1.0)


def run(app: DashboardApp, entry: RunEntry, since: int, after: int, stream: EventStream) -> None:
    """Push what changed: status, new/replaced steps, gradient flow, system samples, events,
    checkpoints, plans."""
    store = entry.store()
    step_v = sys_v = flow_v = since
    seq = after
    status_last: dict[str, Any] | None = None
    side_last: Any = None
    side_at = 0.0
    while not app.stopping.is_set() and not stream.viewer_gone():
        sent = False
        status = entry.status()
        if status != status_last:
            stream.send("status", api.clean({**status, "summary": api.run_summary(entry, wait=True)}))
            status_last, sent = status, True
        steps = store.steps_since(step_v)
        if steps:
            step_v = max(r["version"] for r in steps)
            stream.send("steps", api.clean(steps))
            sent = True
        flow = api.gradflow_since(entry, flow_v)
        if flow is not None:
            flow_v = flow.pop("since")
            stream.send("gradflow", flow)
            sent = True
        system = store.system_since(sys_v)
        if system:
            sys_v = max(r["version"] for r in system)
            stream.send("system", api.clean(system))
            sent = True
        events = store.events(after_seq=seq, limit=500)
        if events:
            # Every indexed event has its seq: the next poll asks only for later ones.
            seq = max(seq, *(e.seq for e in events if e.seq is not None))
            stream.send("events", [api.event_dict(e) for e in events])
            sent = True
        if time.monotonic() - side_at > 2.0:
            side = {"checkpoints": entry.checkpoints(), "plans": api.plans(entry)}
            side_at = time.monotonic()
            if side != side_last:
                stream.send("side", side)
                side_last, sent = side, True
        stream.flush(sent)
        app.stopping.wait(app.poll_s)

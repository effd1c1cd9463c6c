"""Every route of the dashboard, as one table: method, path, who may use it, what answers it.

Served to other machines (bound off loopback, or behind a proxy at ``public_url``), every
``READ`` route needs the token too; the ``OPEN`` ones hold no data (see :mod:`steadytune.web.auth`).
A path's ``{name}`` parts are handed to the endpoint unquoted; a run id is validated before any
path is built from it (:meth:`steadytune.web.runs.RunsIndex.get`).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from steadytune.protocol import ControlError, operator_issuer, send_control
from steadytune.rundir import valid_run_id
from steadytune.server.queue import QueueError
from steadytune.web import api, goodput, runlist, sse
from steadytune.web.auth import Access, may_read
from steadytune.web.metrics import CONTENT_TYPE, render_metrics
from steadytune.web.params import BadParam, query_float, query_indices, query_int
from steadytune.web.runs import RunEntry
from steadytune.web.security import bearer, token_ok

if TYPE_CHECKING:
    from email.message import Message

    from steadytune.web.app import DashboardApp
    from steadytune.web.sse import EventStream


class Handler(Protocol):
    """What an endpoint may ask of the request it answers (``web.handler.Handler`` is one):
    the routes name this contract, not the HTTP machinery, so the two modules import one way."""

    app: DashboardApp
    headers: Message
    client_address: Any

    def send(self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None: ...
    def json(self, obj: Any, status: int = 200, extra: dict[str, str] | None = None) -> None: ...
    def error(
        self, status: int, message: str, extra: dict[str, str] | None = None, **fields: Any
    ) -> None: ...
    def not_found(self) -> None: ...
    def confirmed_body(self) -> dict[str, Any] | None: ...
    def stream(self, body: Callable[[EventStream], None]) -> None: ...


Params = dict[str, str]
Query = dict[str, list[str]]
Endpoint = Callable[[Handler, Params, Query], None]

STATIC_DIR = Path(__file__).parent / "static"
_STATIC_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
JOB_ACTIONS = ("cancel", "hold", "release")


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # "/api/runs/{run}/series": literal parts, and {name} parts handed to the endpoint
    access: Access
    endpoint: Endpoint

    def match(self, method: str, parts: list[str]) -> Params | None:
        pattern = [p for p in self.path.split("/") if p]
        if method != self.method or len(parts) != len(pattern):
            return None
        params: Params = {}
        for want, got in zip(pattern, parts, strict=True):
            if want.startswith("{"):
                params[want[1:-1]] = urllib.parse.unquote(got)
            elif want != got:
                return None
        return params


def find(method: str, path: str) -> tuple[Route, Params] | None:
    """The route for ``method`` and the path of a URL (``HEAD`` takes the ``GET`` routes)."""
    parts = [p for p in urllib.parse.urlsplit(path).path.split("/") if p]
    method = "GET" if method == "HEAD" else method
    for route in ROUTES:
        params = route.match(method, parts)
        if params is not None:
            return route, params
    return None


# ---- the pages ----------------------------------------------------------------------------


def static(h: Handler, name: str) -> None:
    if not _STATIC_NAME.match(name):
        return h.not_found()
    path = STATIC_DIR / name
    try:
        body = path.read_bytes()
    except OSError:
        return h.not_found()
    h.send(200, body, _TYPES.get(path.suffix, "application/octet-stream"))


def run_page(h: Handler, p: Params, q: Query) -> None:
    if not may_read(h.app, h.headers):  # the page holds no data; do not tell which runs exist
        return static(h, "run.html") if valid_run_id(p["run"]) else h.not_found()
    return static(h, "run.html") if h.app.index.get(p["run"]) else h.not_found()


def server_page(h: Handler, p: Params, q: Query) -> None:
    return static(h, "server.html") if h.app.server is not None else h.not_found()


def auth_info(h: Handler, p: Params, q: Query) -> None:
    app = h.app
    h.json(
        {
            "controls": bool(app.token),
            "authorized": token_ok(app.token, bearer(h.headers)),
            "reads": "token" if app.exposed else "open",
        }
    )


# ---- reads -----------------------------------------------------------------------------------


def _run(h: Handler, p: Params) -> RunEntry | None:
    entry = h.app.index.get(p["run"])
    if entry is None:
        h.not_found()
    elif not entry.seen():
        entry.refresh()  # one run asked for by name is read here, whole (the indexer leaves unseen runs)
    return entry


def run_detail(h: Handler, p: Params, q: Query) -> None:
    if entry := _run(h, p):
        h.json(api.run_detail(entry))


def series(h: Handler, p: Params, q: Query) -> None:
    if entry := _run(h, p):
        points = query_int(q, "points", 1500, lo=10, hi=api.MAX_POINTS)
        gpus = query_indices(q, "gpus")
        answer = api.series(entry, points, query_float(q, "lo"), query_float(q, "hi"), gpus)
        h.send(200, api.encode(answer), "application/json")


def gradflow(h: Handler, p: Params, q: Query) -> None:
    if entry := _run(h, p):
        points = query_int(q, "points", 400, lo=10, hi=api.MAX_POINTS)
        h.json(api.gradflow(entry, points, query_float(q, "lo"), query_float(q, "hi")))


def gradhist(h: Handler, p: Params, q: Query) -> None:
    if entry := _run(h, p):
        if "step" not in q:
            raise BadParam("step", "gradhist needs step=<a recorded optimizer step>, e.g. ?step=50")
        h.json(api.gradhist(entry, query_int(q, "step", 0, lo=0)))


def events(h: Handler, p: Params, q: Query) -> None:
    if entry := _run(h, p):
        after = query_int(q, "after", -1, lo=-1)
        h.json([api.event_dict(e) for e in entry.store().events(after_seq=after, limit=1000)])


def run_stream(h: Handler, p: Params, q: Query) -> None:
    if entry := _run(h, p):
        since, after = query_int(q, "since", 0, lo=0), query_int(q, "after", -1, lo=-1)
        h.stream(lambda out: sse.run(h.app, entry, since, after, out))


def goodput_accounts(h: Handler, p: Params, q: Query) -> None:
    h.json(goodput.payload(h.app.index, h.app.server, h.app.clock()))


def runs_stream(h: Handler, p: Params, q: Query) -> None:
    query = runlist.parse_query(q) if runlist.wants_page(q) else None
    h.stream(lambda out: sse.runs(h.app, out, query))


def metrics(h: Handler, p: Params, q: Query) -> None:
    body = render_metrics(h.app.index, h.app.clock, h.app.metrics_keep_finished_s)
    h.send(200, body.encode("utf-8"), CONTENT_TYPE)


def server_snapshot(h: Handler, p: Params, q: Query) -> None:
    return h.json(h.app.server.snapshot()) if h.app.server is not None else h.not_found()


# ---- operator controls ------------------------------------------------------------------------


def control(h: Handler, p: Params, q: Query) -> None:
    """``{"command", "issuer", "confirm": true, "args"?}``: queued for the run's supervisor."""
    entry = h.app.index.get(p["run"])
    if entry is None:
        return h.not_found()
    body = h.confirmed_body()
    if body is None:
        return None
    args = body.get("args") or None
    try:
        if args is not None and not isinstance(args, dict):
            raise ControlError(f'args {args!r}: send an object, e.g. {{"mode": "hold"}}')
        issuer = operator_issuer(str(body.get("issuer") or ""), f"dashboard, {h.client_address[0]}")
        request = send_control(entry.dir, str(body.get("command")), issuer, args)
    except ControlError as exc:
        return h.error(400, str(exc))
    h.json({"ok": True, "id": request["id"], "command": request["command"], "issuer": issuer})


def job_action(h: Handler, p: Params, q: Query) -> None:
    """``POST /api/server/jobs/<id>/<cancel|hold|release>`` with ``{"confirm": true}``."""
    if h.app.server is None or p["action"] not in JOB_ACTIONS:
        return h.not_found()
    if h.confirmed_body() is None:
        return None
    try:
        job = h.app.server.act(p["action"], p["job"])
    except QueueError as exc:
        return h.error(400, str(exc))
    h.json({"ok": True, "job": job.to_dict()})


def _page(name: str) -> Endpoint:
    def serve(h: Handler, p: Params, q: Query) -> None:
        static(h, name)

    return serve


def _ok(h: Handler, p: Params, q: Query) -> None:
    h.json({"ok": True})


def _runs(h: Handler, p: Params, q: Query) -> None:
    """Every run's row; with any of ``limit``, ``offset``, ``q``, ``state``, ``sort``, ``order``,
    one page of them and the counts of all (:mod:`.runlist`)."""
    if runlist.wants_page(q):
        query = runlist.parse_query(q)
        return h.json(runlist.select(api.runs_list(h.app.index), query))
    h.json(api.runs_list(h.app.index))


def _static(h: Handler, p: Params, q: Query) -> None:
    static(h, p["name"])


OPEN, READ, CONTROL = Access.OPEN, Access.READ, Access.CONTROL
ROUTES: tuple[Route, ...] = (
    Route("GET", "/", OPEN, _page("index.html")),
    Route("GET", "/static/{name}", OPEN, _static),
    Route("GET", "/run/{run}", OPEN, run_page),
    Route("GET", "/server", OPEN, server_page),
    Route("GET", "/healthz", OPEN, _ok),
    Route("GET", "/api/auth", OPEN, auth_info),
    Route("GET", "/metrics", READ, metrics),
    Route("GET", "/api/server", READ, server_snapshot),
    Route("GET", "/api/runs", READ, _runs),
    Route("GET", "/api/goodput", READ, goodput_accounts),
    Route("GET", "/api/stream", READ, runs_stream),
    Route("GET", "/api/runs/{run}", READ, run_detail),
    Route("GET", "/api/runs/{run}/series", READ, series),
    Route("GET", "/api/runs/{run}/gradflow", READ, gradflow),
    Route("GET", "/api/runs/{run}/gradhist", READ, gradhist),
    Route("GET", "/api/runs/{run}/events", READ, events),
    Route("GET", "/api/runs/{run}/stream", READ, run_stream),
    Route("POST", "/api/runs/{run}/control", CONTROL, control),
    Route("POST", "/api/server/jobs/{job}/{action}", CONTROL, job_action),
)

__all__ = ["ROUTES", "Route", "find"]

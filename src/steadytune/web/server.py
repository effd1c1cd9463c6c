"""The dashboard server: stdlib ``ThreadingHTTPServer`` in a background thread.

Routes (all GET unless said; the API is read-only without the token). Served to
other machines (bound off loopback, or behind a proxy at ``public_url``), every
route but the pages, ``/static``, ``/healthz`` and ``/api/auth`` needs the token:

    /                          runs page            /run/<id>            run page
    /static/<file>             assets               /metrics             Prometheus exposition
    /api/runs                  runs (JSON)          /api/stream          runs, live (SSE)
    /api/runs/<id>             one run              /api/runs/<id>/series?points=&lo=&hi=
    /api/runs/<id>/events?after=<seq>               /api/runs/<id>/stream?since=<version>&after=<seq> (SSE)
    /api/runs/<id>/gradflow?points=&lo=&hi=         gradient-flow heat map (layers × recorded steps)
    /api/runs/<id>/gradhist?step=                   |grad| histogram per layer at one gradient-flow recording
    /api/goodput               every run's goodput account (and, on a server, each GPU's hours)
    /api/auth                  may this client act? /healthz
    POST /api/runs/<id>/control   {"command", "issuer", "confirm": true} with the token in a header
    /server                    GPU server page      /api/server          its GPUs, reservations and queue
    POST /api/server/jobs/<id>/<cancel|hold|release>   {"confirm": true} with the token in a header
                               (the server routes exist when `steadytune server --dashboard` serves it)

The supervisor stays light: no framework, one thread per connection (at most
``max_connections``, of which ``max_streams`` live streams; beyond, 503 with
``Retry-After``), every request read within ``request_timeout_s``, one indexer
thread that tails the runs that have no live supervisor.
"""

from __future__ import annotations

import json
import logging
import re
import select
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from steadytune.protocol import ControlError, operator_issuer
from steadytune.rundir import valid_run_id
from steadytune.server.queue import QueueError
from steadytune.supervise.control import send_control
from steadytune.web import api, goodput
from steadytune.web.httpserver import RETRY_AFTER_S, BoundedServer
from steadytune.web.metrics import CONTENT_TYPE, render_metrics
from steadytune.web.params import BadParam, content_length, query_float, query_int
from steadytune.web.runs import RunEntry, RunsIndex
from steadytune.web.security import (
    TOKEN_HEADER,
    bearer,
    check_bind,
    host_allowed,
    is_loopback,
    machine_names,
    reads_need_token,
    token_ok,
)

log = logging.getLogger(__name__)
MAX_BODY = 4096

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
_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
}


@dataclass
class DashboardApp:
    """Everything a request handler needs; one per server."""

    index: RunsIndex
    host: str
    port: int
    token: str | None
    clock: Callable[[], float] = time.time
    poll_s: float = 0.25
    stopping: threading.Event = field(default_factory=threading.Event)
    # Reachable from other machines: reads need the token too (see security.reads_need_token).
    exposed: bool = False
    public_url: str | None = None
    machine_names: frozenset[str] = frozenset()
    max_streams: int = 16
    # The GPU server's daemon (snapshot() and act(op, job)), when `steadytune server` serves the dashboard.
    server: Any = None
    streams: threading.BoundedSemaphore = field(init=False)

    def __post_init__(self) -> None:
        self.streams = threading.BoundedSemaphore(self.max_streams)

    def indexer(self, interval_s: float = 0.2) -> None:
        """Keep the indexes of supervisor-less runs fresh, off the request path."""
        while not self.stopping.wait(interval_s):
            self.index.refresh_all()


class Handler(BaseHTTPRequestHandler):
    app: DashboardApp  # set on the subclass made by make_handler
    protocol_version = "HTTP/1.1"
    server_version = "steadytune"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        # Quiet by default: the supervisor's console is for the run, not for page hits.
        return

    # ---- plumbing -------------------------------------------------------------------

    def handle_one_request(self) -> None:
        # The whole request (line, headers, body) must arrive within request_timeout_s:
        # the socket timeout alone would let a client trickle one byte at a time forever.
        self.server.expect(self.connection)  # type: ignore[attr-defined]
        super().handle_one_request()

    def _request_read(self) -> None:
        self.server.forget(self.connection)  # type: ignore[attr-defined]

    def _headers(
        self, status: int, ctype: str, length: int | None, extra: dict[str, str] | None = None
    ) -> None:
        self._responded = True
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.send_header("Cache-Control", "no-store")
        for k, v in {**_SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(k, v)
        self.end_headers()

    def _send(self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
        self._headers(status, ctype, len(body), extra)
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj: Any, status: int = 200, extra: dict[str, str] | None = None) -> None:
        body = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")
        self._send(status, body, "application/json", extra)

    def _error(self, status: int, message: str, extra: dict[str, str] | None = None, **fields: Any) -> None:
        self._json({"error": message, **fields}, status, extra)

    def _bad_param(self, exc: BadParam) -> None:
        self.close_connection = True  # what follows a bad Content-Length cannot be trusted
        self._error(400, str(exc), param=exc.param)

    def _failed(self, exc: BaseException) -> None:
        """An unexpected error: one line in the log, a 500 if nothing was sent yet, never a traceback."""
        log.warning("dashboard: %s %s failed: %s: %s", self.command, self.path[:200], type(exc).__name__, exc)
        log.debug("dashboard request failure", exc_info=exc)
        self.close_connection = True
        if not getattr(self, "_responded", False):
            try:
                self._error(500, f"internal error ({type(exc).__name__}); the dashboard keeps running")
            except OSError:
                pass

    def _not_found(self) -> None:
        self._error(404, "not found")

    def _run(self, raw_id: str) -> RunEntry | None:
        return self.app.index.get(urllib.parse.unquote(raw_id))

    # ---- dispatch -------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_OPTIONS(self) -> None:
        self._request_read()
        # No CORS: a preflight is refused, so other origins cannot send the token header.
        self._error(405, "CORS is not enabled")

    def _guard(self) -> bool:
        app = self.app
        if not host_allowed(self.headers.get("Host"), app.host, app.port, app.public_url, app.machine_names):
            self._error(
                403,
                "this dashboard does not answer to that Host name (DNS rebinding); use its address or a "
                "loopback name, or set dashboard.public_url to the URL you reach it by",
            )
            return False
        return True

    def _may_read(self) -> bool:
        return not self.app.exposed or token_ok(self.app.token, bearer(self.headers))

    def _unauthorized(self) -> None:
        self._error(
            401,
            f"this dashboard is reachable from other machines: send the token in the {TOKEN_HEADER} header "
            "or as Authorization: Bearer",
            {"WWW-Authenticate": 'Bearer realm="steadytune"'},
        )

    def do_GET(self) -> None:
        self._request_read()
        try:
            if not self._guard():
                return
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            parts = [p for p in url.path.split("/") if p]
            self._route_get(parts, query)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except BadParam as exc:
            self._bad_param(exc)
        except Exception as exc:
            self._failed(exc)

    def _route_get(self, parts: list[str], q: dict[str, list[str]]) -> None:
        app = self.app
        if not parts:
            return self._static("index.html")
        head = parts[0]
        if head == "static" and len(parts) == 2:
            return self._static(parts[1])
        if head == "run" and len(parts) == 2:
            if not self._may_read():  # the page holds no data; do not tell which runs exist
                ok = valid_run_id(urllib.parse.unquote(parts[1]))
                return self._static("run.html") if ok else self._not_found()
            return self._static("run.html") if self._run(parts[1]) else self._not_found()
        if head == "server" and len(parts) == 1:
            return self._static("server.html") if app.server is not None else self._not_found()
        if head == "healthz":
            return self._json({"ok": True})
        if parts == ["api", "auth"]:
            return self._json(
                {
                    "controls": bool(app.token),
                    "authorized": token_ok(app.token, bearer(self.headers)),
                    "reads": "token" if app.exposed else "open",
                }
            )
        if not self._may_read():
            return self._unauthorized()
        if head == "metrics" and len(parts) == 1:
            text = render_metrics(app.index, app.clock)
            return self._send(200, text.encode("utf-8"), CONTENT_TYPE)
        if head != "api" or len(parts) < 2:
            return self._not_found()
        if parts[1:] == ["server"]:
            return self._json(app.server.snapshot()) if app.server is not None else self._not_found()
        if parts[1:] == ["runs"]:
            return self._json(api.runs_list(app.index))
        if parts[1:] == ["goodput"]:
            return self._json(goodput.payload(app.index, app.server, app.clock()))
        if parts[1:] == ["stream"]:
            return self._stream(self._sse_runs)
        if parts[1] == "runs" and len(parts) in (3, 4):
            entry = self._run(parts[2])
            if entry is None:
                return self._not_found()
            what = parts[3] if len(parts) == 4 else ""
            if what == "":
                return self._json(api.run_detail(entry))
            if what == "series":
                points = query_int(q, "points", 1500, lo=10, hi=api.MAX_POINTS)
                return self._json(api.series(entry, points, query_float(q, "lo"), query_float(q, "hi")))
            if what == "gradflow":
                points = query_int(q, "points", 400, lo=10, hi=api.MAX_POINTS)
                return self._json(api.gradflow(entry, points, query_float(q, "lo"), query_float(q, "hi")))
            if what == "gradhist":
                if "step" not in q:
                    raise BadParam("step", "gradhist needs step=<a recorded optimizer step>, e.g. ?step=50")
                return self._json(api.gradhist(entry, query_int(q, "step", 0, lo=0)))
            if what == "events":
                after = query_int(q, "after", -1, lo=-1)
                return self._json(
                    [api.event_dict(e) for e in entry.store().events(after_seq=after, limit=1000)]
                )
            if what == "stream":
                since, after = query_int(q, "since", 0, lo=0), query_int(q, "after", -1, lo=-1)
                return self._stream(lambda: self._sse_run(entry, since, after))
        return self._not_found()

    def _static(self, name: str) -> None:
        if not _STATIC_NAME.match(name):
            return self._not_found()
        path = STATIC_DIR / name
        try:
            body = path.read_bytes()
        except OSError:
            return self._not_found()
        self._send(200, body, _TYPES.get(path.suffix, "application/octet-stream"))

    # ---- operator controls ------------------------------------------------------------

    def do_POST(self) -> None:
        try:
            self._post()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except BadParam as exc:
            self._bad_param(exc)
        except Exception as exc:
            self._failed(exc)

    def _post(self) -> None:
        asked_close = self.close_connection
        self.close_connection = True  # until the body is read: what follows it is not a request to parse
        try:
            if not self._guard():
                return
            parts = [p for p in urllib.parse.urlsplit(self.path).path.split("/") if p]
            job_action = server_action(parts) if self.app.server is not None else None
            entry = None
            if job_action is None:
                if len(parts) != 4 or parts[:2] != ["api", "runs"] or parts[3] != "control":
                    return self._not_found()
                entry = self._run(parts[2])
                if entry is None:
                    return self._not_found()
            if not self.app.token:
                return self._error(
                    403, "operator controls are off: start the dashboard with a token to enable them"
                )
            if not token_ok(self.app.token, bearer(self.headers)):
                return self._error(401, "a valid token is required in the X-Steadytune-Token header")
            length = content_length(self.headers)
            if length <= 0 or length > MAX_BODY:
                return self._error(400, "send a JSON body of at most 4 KiB")
            raw = self.rfile.read(length)
            self._request_read()
            self.close_connection = asked_close or len(raw) < length
            try:
                body = json.loads(raw)
            except (ValueError, RecursionError):
                return self._error(400, "the body is not JSON")
            if not isinstance(body, dict) or body.get("confirm") is not True:
                return self._error(400, 'confirm the request with "confirm": true')
            if job_action is not None:
                try:
                    job = self.app.server.act(job_action[1], job_action[0])
                except QueueError as exc:
                    return self._error(400, str(exc))
                return self._json({"ok": True, "job": job.to_dict()})
            assert entry is not None
            args = body.get("args") or None
            try:
                if args is not None and not isinstance(args, dict):
                    raise ControlError(f'args {args!r}: send an object, e.g. {{"mode": "hold"}}')
                issuer = operator_issuer(
                    str(body.get("issuer") or ""), f"dashboard, {self.client_address[0]}"
                )
                request = send_control(entry.dir, str(body.get("command")), issuer, args)
            except ControlError as exc:
                return self._error(400, str(exc))
            self._json({"ok": True, "id": request["id"], "command": request["command"], "issuer": issuer})
        finally:
            self._request_read()

    # ---- live updates (Server-Sent Events) ----------------------------------------------

    def _stream(self, body: Callable[[], None]) -> None:
        """Run one live stream, if a slot is free (at most ``max_streams`` at once)."""
        if not self.app.streams.acquire(blocking=False):
            return self._error(
                503,
                f"too many live streams ({self.app.max_streams}); retry in a few seconds",
                {"Retry-After": str(RETRY_AFTER_S)},
            )
        try:
            body()
        finally:
            self.app.streams.release()

    def _client_gone(self) -> bool:
        """The viewer closed its end: stop now rather than at the next write (up to 15 s away)."""
        try:
            if hasattr(select, "poll"):
                poller = select.poll()
                poller.register(self.connection, select.POLLIN)
                if not poller.poll(0):
                    return False
            elif not select.select([self.connection], [], [], 0)[0]:
                return False
            return not self.connection.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return False
        except (OSError, ValueError):
            return True

    def _sse_open(self) -> None:
        self._headers(200, "text/event-stream", None, {"Connection": "close", "X-Accel-Buffering": "no"})
        self.close_connection = True
        self.wfile.write(b"retry: 1000\n\n")
        self.wfile.flush()

    def _sse(self, event: str, data: Any) -> None:
        payload = json.dumps(data, separators=(",", ":"), allow_nan=False)
        self.wfile.write(f"event: {event}\ndata: {payload}\n\n".encode())

    def _sse_runs(self) -> None:
        self._sse_open()
        last = None
        beat = time.monotonic()
        while not self.app.stopping.is_set() and not self._client_gone():
            rows = api.runs_list(self.app.index)
            if rows != last:
                self._sse("runs", rows)
                self.wfile.flush()
                last, beat = rows, time.monotonic()
            elif time.monotonic() - beat > 15:
                self.wfile.write(b": keep-alive\n\n")
                self.wfile.flush()
                beat = time.monotonic()
            self.app.stopping.wait(1.0)

    def _sse_run(self, entry: RunEntry, since: int, after: int) -> None:
        """Push what changed: status, new/replaced steps, gradient flow, system samples, events, checkpoints,
        plans."""
        self._sse_open()
        store = entry.store()
        step_v = sys_v = flow_v = since
        seq = after
        status_last: dict[str, Any] | None = None
        side_last: Any = None
        side_at = 0.0
        beat = time.monotonic()
        while not self.app.stopping.is_set() and not self._client_gone():
            sent = False
            status = entry.status()
            if status != status_last:
                self._sse("status", api.clean({**status, "summary": api.run_summary(entry)}))
                status_last, sent = status, True
            steps = store.steps_since(step_v)
            if steps:
                step_v = max(r["version"] for r in steps)
                self._sse("steps", api.clean(steps))
                sent = True
            flow = api.gradflow_since(entry, flow_v)
            if flow is not None:
                flow_v = flow.pop("since")
                self._sse("gradflow", flow)
                sent = True
            system = store.system_since(sys_v)
            if system:
                sys_v = max(r["version"] for r in system)
                self._sse("system", api.clean(system))
                sent = True
            events = store.events(after_seq=seq, limit=500)
            if events:
                # Every indexed event has its seq: the next poll asks only for later ones.
                seq = max(seq, *(e.seq for e in events if e.seq is not None))
                self._sse("events", [api.event_dict(e) for e in events])
                sent = True
            if time.monotonic() - side_at > 2.0:
                side = {"checkpoints": entry.checkpoints(), "plans": api.plans(entry)}
                side_at = time.monotonic()
                if side != side_last:
                    self._sse("side", side)
                    side_last, sent = side, True
            if sent:
                self.wfile.flush()
                beat = time.monotonic()
            elif time.monotonic() - beat > 15:
                self.wfile.write(b": keep-alive\n\n")
                self.wfile.flush()
                beat = time.monotonic()
            self.app.stopping.wait(self.app.poll_s)


def server_action(parts: list[str]) -> tuple[str, str] | None:
    """``(job id, action)`` for ``POST /api/server/jobs/<id>/<action>``, else None."""
    if (
        len(parts) == 5
        and parts[:3] == ["api", "server", "jobs"]
        and parts[4] in ("cancel", "hold", "release")
    ):
        return urllib.parse.unquote(parts[3]), parts[4]
    return None


def make_handler(app: DashboardApp, request_timeout_s: float = 10.0) -> type[Handler]:
    # ``timeout`` is the socket timeout of each connection (StreamRequestHandler.setup).
    return type("DashboardHandler", (Handler,), {"app": app, "timeout": request_timeout_s})


@dataclass
class DashboardHandle:
    """A running dashboard: ``url`` to open, ``stop()`` to end it."""

    url: str
    host: str
    port: int
    app: DashboardApp
    _server: BoundedServer
    _threads: list[threading.Thread]

    def stop(self, timeout: float = 5.0) -> None:
        self.app.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        for t in self._threads:
            t.join(timeout)
        self.app.index.close()


def start_dashboard(
    runs_dir: Path,
    host: str = "127.0.0.1",
    port: int = 7860,
    token: str | None = None,
    clock: Callable[[], float] = time.time,
    poll_s: float = 0.25,
    *,
    public_url: str | None = None,
    request_timeout_s: float = 10.0,
    max_connections: int = 64,
    max_streams: int = 16,
    exposed: bool | None = None,
    server: Any = None,
) -> DashboardHandle:
    """Serve the dashboard of every run under ``runs_dir`` from a background thread.

    ``public_url``: the URL it is reached at behind a reverse proxy (its host is
    accepted in Host headers). Bound off loopback or given a ``public_url``, the
    dashboard is *exposed*: every read needs the token; ``exposed`` overrides that
    judgement (tests, or a loopback port forwarded to the network).
    ``request_timeout_s``, ``max_connections``, ``max_streams``: see DashboardConfig.
    ``server``: the GPU server's daemon, for the server page and its API.

    Raises :class:`steadytune.web.security.BindRefused` when exposed without a
    token, and ``OSError`` when the port is taken.
    """
    if exposed is None:
        exposed = reads_need_token(host, public_url)
    check_bind(host, token, public_url=public_url, exposed=exposed)
    max_streams = max(1, min(max_streams, max_connections - 1))
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    index = RunsIndex(Path(runs_dir), clock=clock)
    app = DashboardApp(
        index=index, host=host, port=port, token=token, clock=clock, poll_s=poll_s, exposed=exposed,
        public_url=public_url, machine_names=machine_names() if not is_loopback(host) else frozenset(),
        max_streams=max_streams, server=server,
    )  # fmt: skip
    server = BoundedServer(
        (host.strip("[]"), port),
        make_handler(app, request_timeout_s),
        family,
        max_connections,
        request_timeout_s,
    )
    app.port = server.server_address[1]
    serve = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.25}, name="steadytune-dashboard", daemon=True
    )
    indexer = threading.Thread(target=app.indexer, name="steadytune-indexer", daemon=True)
    reaper = threading.Thread(target=server.reap, args=(app.stopping,), name="steadytune-reaper", daemon=True)
    serve.start()
    indexer.start()
    reaper.start()
    shown = host if is_loopback(host) or host not in ("0.0.0.0", "::") else socket.getfqdn()
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    url = f"http://{shown}:{app.port}/"
    return DashboardHandle(
        url=url, host=host, port=app.port, app=app, _server=server, _threads=[serve, indexer, reaper]
    )


__all__ = ["DashboardHandle", "start_dashboard"]

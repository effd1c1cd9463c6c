"""One connection's requests: read within the deadline, bounded, checked, routed, answered.

The plumbing only: what each path does is in :mod:`steadytune.web.routes`, who may use it in
:mod:`steadytune.web.auth`, the body in :mod:`steadytune.web.body`, the live streams in
:mod:`steadytune.web.sse`. Every answer, the standard library's own error pages included,
carries the security headers, and no request may send more than :data:`MAX_HEAD_BYTES` of
request line and headers: before this cap, 60 connections sending 99 headers of 64 KB each
(never finished, never authenticated) took the dashboard from 42 to 420 MB.
"""

from __future__ import annotations

import http.client
import json
import logging
import urllib.parse
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Protocol

from steadytune.regularfile import NotRegularFile
from steadytune.web import routes
from steadytune.web.app import DashboardApp
from steadytune.web.auth import access_denied, host_denied
from steadytune.web.body import BodyError, read_json_body
from steadytune.web.httpserver import RETRY_AFTER_S
from steadytune.web.params import BadParam
from steadytune.web.sse import EventStream, with_slot

log = logging.getLogger("steadytune.web.server")

MAX_HEAD_BYTES = 64 * 1024  # request line and headers of one request; a browser sends a few KB
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
}


class HeadTooLarge(http.client.HTTPException):
    """More header bytes than :data:`MAX_HEAD_BYTES`; the standard library answers it with 431."""


class _LineReader(Protocol):
    def readline(self, size: int = -1, /) -> bytes: ...


class _HeadReader:
    """The connection's reader while the headers are parsed: refuses past ``left`` bytes."""

    def __init__(self, raw: _LineReader, left: int) -> None:
        self._raw, self._left = raw, left

    def readline(self, limit: int = -1) -> bytes:
        want = self._left + 1 if limit < 0 else min(limit, self._left + 1)
        line = self._raw.readline(want)
        self._left -= len(line)
        if self._left < 0:
            raise HeadTooLarge(f"more than {MAX_HEAD_BYTES} bytes of request headers")
        return line


class Handler(BaseHTTPRequestHandler):
    app: DashboardApp  # set on the subclass made by steadytune.web.server.make_handler
    protocol_version = "HTTP/1.1"
    # A request line that does not parse is answered with a status line and headers, not HTTP/0.9's bare body.
    default_request_version = "HTTP/1.1"
    server_version = "steadytune"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        # Quiet by default: the supervisor's console is for the run, not for page hits.
        return

    # ---- reading the request ------------------------------------------------------------------

    def handle_one_request(self) -> None:
        # The whole request (line, headers, body) must arrive within request_timeout_s:
        # the socket timeout alone would let a client trickle one byte at a time forever.
        self._responded = self._asked_close = False
        self.server.expect(self.connection)  # type: ignore[attr-defined]
        super().handle_one_request()

    def parse_request(self) -> bool:
        raw = self.rfile
        line = getattr(self, "raw_requestline", b"")  # set by handle_one_request before this
        self.rfile = _HeadReader(raw, MAX_HEAD_BYTES - len(line))  # type: ignore[assignment]
        try:
            return super().parse_request()
        finally:
            self.rfile = raw

    def request_read(self) -> None:
        """The request is in: its deadline no longer applies (a stream may then run for hours)."""
        self.server.forget(self.connection)  # type: ignore[attr-defined]

    # ---- answering ----------------------------------------------------------------------------

    def _headers(
        self, status: int, ctype: str, length: int | None, extra: dict[str, str] | None = None
    ) -> None:
        self._responded = True
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.send_header("Cache-Control", "no-store")
        for k, v in {**SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(k, v)
        self.end_headers()

    def send(self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
        self._headers(status, ctype, len(body), extra)
        if self.command != "HEAD":
            self.wfile.write(body)

    def json(self, obj: Any, status: int = 200, extra: dict[str, str] | None = None) -> None:
        body = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")
        self.send(status, body, "application/json", extra)

    def error(self, status: int, message: str, extra: dict[str, str] | None = None, **fields: Any) -> None:
        self.json({"error": message, **fields}, status, extra)

    def not_found(self) -> None:
        self.error(404, "not found")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's errors (400, 414, 431, 501, ...) as ours: JSON, with the security
        headers, and the connection closed (what follows a broken request cannot be parsed)."""
        self.close_connection = True
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        text = message or phrase
        if explain:
            text = f"{text}: {explain}"
        try:
            self.error(code, text[:300], {"Connection": "close"})
        except OSError:
            pass

    def confirmed_body(self) -> dict[str, Any] | None:
        """The POST body, once it is a JSON object with ``"confirm": true``; else a 400 was sent."""
        try:
            body, whole = read_json_body(self.headers, self.rfile)
        except BodyError as exc:
            self.error(400, str(exc))
            return None
        self.request_read()
        self.close_connection = self._asked_close or not whole
        if body.get("confirm") is not True:
            self.error(400, 'confirm the request with "confirm": true')
            return None
        return body

    def stream(self, body: Callable[[EventStream], None]) -> None:
        """A live stream, if one of the ``max_streams`` slots is free; else 503 with Retry-After."""

        def run() -> None:
            self._headers(200, "text/event-stream", None, {"Connection": "close", "X-Accel-Buffering": "no"})
            self.close_connection = True
            out = EventStream(self.wfile, self.connection)
            out.begin()
            body(out)

        with_slot(
            self.app,
            run,
            lambda: self.error(
                503,
                f"too many live streams ({self.app.max_streams}); retry in a few seconds",
                {"Retry-After": str(RETRY_AFTER_S)},
            ),
        )

    # ---- dispatch -----------------------------------------------------------------------------

    def do_GET(self) -> None:
        self.request_read()
        self._dispatch()

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        self._asked_close = self.close_connection
        self.close_connection = True  # until the body is read: what follows it is not a request to parse
        try:
            self._dispatch()
        finally:
            self.request_read()

    def do_OPTIONS(self) -> None:
        self.request_read()
        # No CORS: a preflight is refused, so other origins cannot send the token header.
        self.error(405, "CORS is not enabled")

    def _dispatch(self) -> None:
        try:
            denied = host_denied(self.app, self.headers)
            found = routes.find(self.command, self.path) if denied is None else None
            if found is not None:
                route, params = found
                denied = access_denied(self.app, self.headers, route.access)
            if denied is not None:
                return self.error(denied.status, denied.message, denied.headers)
            if found is None:
                return self.not_found()
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            route.endpoint(self, params, query)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except BadParam as exc:
            self.close_connection = True  # what follows a bad Content-Length cannot be trusted
            self.error(400, str(exc), param=exc.param)
        except NotRegularFile as exc:  # a FIFO or a device where a run's file belongs: never waited on
            self.close_connection = True
            where = Path(exc.filename or "?")
            self.error(500, f"{where.parent.name}/{where.name} is {exc.strerror}: the run cannot be read")
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        """An unexpected error: one line in the log, a 500 if nothing was sent yet, never a traceback."""
        log.warning("dashboard: %s %s failed: %s: %s", self.command, self.path[:200], type(exc).__name__, exc)
        log.debug("dashboard request failure", exc_info=exc)
        self.close_connection = True
        if not self._responded:
            try:
                self.error(500, f"internal error ({type(exc).__name__}); the dashboard keeps running")
            except OSError:
                pass

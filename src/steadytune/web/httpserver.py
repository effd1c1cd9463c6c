"""The dashboard's HTTP server: one thread per connection, at most ``max_connections``; a request not
read by its deadline is cut; over the cap, 503 with ``Retry-After`` from the accepting thread."""

from __future__ import annotations

import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# The dashboard logs under one name, whichever of its modules speaks.
log = logging.getLogger("steadytune.web.server")

RETRY_AFTER_S = 5


class BoundedServer(ThreadingHTTPServer):
    """One thread per connection, at most ``max_connections``; requests read within a deadline."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(
        self,
        addr: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        family: int,
        max_connections: int = 64,
        request_timeout_s: float = 10.0,
    ) -> None:
        self.address_family = family
        self.request_timeout_s = request_timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self._deadlines: dict[socket.socket, float] = {}
        self._deadlines_lock = threading.Lock()
        super().__init__(addr, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.forget(request)
            self._slots.release()

    def _refuse(self, request: socket.socket) -> None:
        """503 at once, from the accepting thread, and close: no thread for a connection over the cap."""
        body = b'{"error":"too many connections to the dashboard; retry in a few seconds"}'
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: {RETRY_AFTER_S}\r\nConnection: close\r\n\r\n"
        )
        try:
            request.settimeout(0.5)  # a few hundred bytes into an empty send buffer: never blocks for long
            request.sendall(head.encode("ascii") + body)
        except OSError:
            pass
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback on stderr, the supervisor's console: one log line instead.
        log.warning("dashboard: a connection from %s failed", client_address[0] if client_address else "?")
        log.debug("dashboard connection failure", exc_info=True)

    # ---- the request deadline -----------------------------------------------------------

    def expect(self, conn: socket.socket) -> None:
        with self._deadlines_lock:
            self._deadlines[conn] = time.monotonic() + self.request_timeout_s

    def forget(self, conn: socket.socket) -> None:
        with self._deadlines_lock:
            self._deadlines.pop(conn, None)

    def reap(self, stopping: threading.Event) -> None:
        """Cut the connections whose request is not in by its deadline."""
        every = min(0.5, max(0.02, self.request_timeout_s / 5))
        while not stopping.wait(every):
            now = time.monotonic()
            with self._deadlines_lock:
                late = [c for c, t in self._deadlines.items() if t <= now]
                for c in late:
                    del self._deadlines[c]
            for c in late:
                try:
                    c.shutdown(socket.SHUT_RDWR)  # the handler's read returns at once and it ends
                except OSError:
                    pass

"""Real local servers the tests deliver to: a webhook receiver on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Hook:
    """A local webhook receiver that records JSON bodies (``fail_first``: answer 503 that many times)."""

    def __init__(self, path: str = "/hook") -> None:
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        self.fail_first = 0
        self.release = threading.Event()  # cleared: every POST is held until the test sets it
        self.release.set()
        self.held = threading.Event()  # set once a POST is waiting on ``release``
        hook = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if not hook.release.is_set():
                    hook.held.set()
                    hook.release.wait(60)
                if hook.fail_first > 0:
                    hook.fail_first -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                hook.paths.append(self.path)
                hook.bodies.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

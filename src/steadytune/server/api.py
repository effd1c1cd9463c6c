"""The daemon's local API: a Unix socket, one JSON object per line each way.

Requests: ``{"op": "ping"}``, ``{"op": "queue"}``, ``{"op": "submit", ...}`` (see
submit.check_request), ``{"op": "cancel"|"hold"|"release", "job": "j3"}``; from a job's
own supervisor, ``{"op": "job", "job": "j3"}`` and ``{"op": "resize", "job": "j3", "gpus": 2,
"reason": "..."}`` (or ``"refused": "..."`` for a shrink it cannot make). Answers:
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``. A submit's answer carries
``never_fits``: why the job cannot run on this host even when it is empty, or null.

The socket is the owner's only (mode 0600): a job runs as the daemon's user, so
whoever can submit can run commands as that user. The submitter is recorded from the
socket's peer credentials, not from anything the client says.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import socketserver
import struct
import threading
from pathlib import Path
from typing import Any

from steadytune.server.daemon import Daemon
from steadytune.server.queue import QueueError
from steadytune.server.submit import SubmitError, submit

MAX_REQUEST = 1 << 20  # an environment and a long command line fit; a runaway client does not


def peer_user(conn: socket.socket) -> str:
    """The user on the other end of a Unix socket (Linux SO_PEERCRED), or '' where unknown."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        return pwd.getpwuid(uid).pw_name
    except (AttributeError, OSError, KeyError):
        return ""


def handle(daemon: Daemon, req: Any, user: str = "") -> dict[str, Any]:
    """Answer one request."""
    if not isinstance(req, dict):
        return {"ok": False, "error": 'send one JSON object per line, e.g. {"op": "queue"}'}
    op = req.get("op")
    try:
        if op == "ping":
            return {"ok": True, "pid": os.getpid()}
        if op == "queue":
            return {"ok": True, **daemon.snapshot()}
        if op == "submit":
            job = submit(daemon.queue, req, user=user)
            return {"ok": True, "job": job.to_dict(), "never_fits": daemon.never_fits(job)}
        if op in ("cancel", "hold", "release"):
            job = daemon.act(op, str(req.get("job", "")))
            return {"ok": True, "job": job.to_dict()}
        if op == "job":
            found = daemon.queue.get(str(req.get("job", "")))
            if found is None:
                return {"ok": False, "error": f"no job {req.get('job')!r}; `steadytune queue` lists them"}
            return {"ok": True, "job": found.to_dict()}
        if op == "resize":
            refused = req.get("refused")
            job = daemon.resize(
                str(req.get("job", "")),
                req.get("gpus"),  # type: ignore[arg-type]  # checked by resize
                str(req.get("reason", "")),
                str(refused) if refused is not None else None,
            )
            return {"ok": True, "job": job.to_dict()}
    except (SubmitError, QueueError) as exc:
        return {"ok": False, "error": str(exc)}
    return {
        "ok": False,
        "error": f"unknown op {op!r}; one of ping, queue, submit, cancel, hold, release, job, resize",
    }


def answer_line(daemon: Daemon, line: bytes, user: str = "") -> dict[str, Any]:
    """The answer to one line read from the socket: whatever it holds, an answer, never an exception."""
    if len(line) > MAX_REQUEST:
        return {"ok": False, "error": "request too long (1 MiB at most)"}
    try:
        req = json.loads(line)
    except RecursionError:
        return {"ok": False, "error": "the request is nested too deep"}
    except ValueError:
        return {"ok": False, "error": "the request is not JSON"}
    return handle(daemon, req, user)


class _Handler(socketserver.StreamRequestHandler):
    daemon_ref: Daemon

    def handle(self) -> None:
        self.connection.settimeout(30)
        try:
            line = self.rfile.readline(MAX_REQUEST + 1)
        except OSError:
            return
        answer = answer_line(self.daemon_ref, line, peer_user(self.connection))
        try:
            self.wfile.write(json.dumps(answer).encode() + b"\n")
        except OSError:
            pass


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


class SocketApi:
    """Serve ``daemon`` on a Unix socket from a background thread."""

    def __init__(self, daemon: Daemon, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            if ping(path):
                raise OSError(f"a server already answers on {path}; stop it first or pick another --socket")
            path.unlink()  # left behind by a server that died
        handler = type("Handler", (_Handler,), {"daemon_ref": daemon})
        old = os.umask(0o177)  # created 0600 from the start: no moment where others could connect
        try:
            self._server = _Server(str(path), handler)
        finally:
            os.umask(old)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="steadytune-socket", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        try:
            self.path.unlink()
        except OSError:
            pass


def request(path: Path, req: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    """Send one request to the daemon on ``path`` and return its answer.

    Raises:
        ConnectionError: no daemon answers there (the message says how to start one).
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(str(path))
            s.sendall(json.dumps(req).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                buf += chunk
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise ConnectionError(
            f"no steadytune server on {path}: start one with `steadytune server` (or pass its --socket)"
        ) from exc
    except OSError as exc:
        raise ConnectionError(f"the server on {path} did not answer: {exc}") from exc
    try:
        answer = json.loads(buf)
    except ValueError as exc:
        raise ConnectionError(f"the server on {path} sent no answer") from exc
    return answer if isinstance(answer, dict) else {"ok": False, "error": "malformed answer"}


def ping(path: Path) -> bool:
    try:
        return bool(request(path, {"op": "ping"}, timeout_s=2.0).get("ok"))
    except ConnectionError:
        return False

"""Security over real sockets: bind policy, forged run ids, tokens in headers only, no CORS."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from live_run import LiveRun
from tests.waiting import ANSWER_S

from steadytune.web.security import BindRefused
from steadytune.web.server import DashboardHandle, start_dashboard

TOKEN = "e2e-operator-token-0123456789"


@pytest.fixture
def secured(runs_dir: Path, live_run: LiveRun) -> Iterator[DashboardHandle]:
    handle = start_dashboard(runs_dir, host="127.0.0.1", port=0, token=TOKEN)
    yield handle
    handle.stop()


def request(handle: DashboardHandle, method: str, path: str, body: dict | None = None,
            headers: dict | None = None) -> tuple[int, dict, bytes]:  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", handle.port, timeout=ANSWER_S)
    data = json.dumps(body).encode() if body is not None else None
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    conn.request(method, path, body=data, headers=hdrs)  # the raw path goes out as written
    resp = conn.getresponse()
    out = resp.status, dict(resp.getheaders()), resp.read()
    conn.close()
    return out


def test_non_loopback_bind_without_token_is_refused(runs_dir: Path) -> None:
    with pytest.raises(BindRefused, match="no token is set"):
        start_dashboard(runs_dir, host="0.0.0.0", port=0, token=None)
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "steadytune.cli.main",
            "dashboard",
            str(runs_dir),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert cli.returncode == 2
    assert (
        "refusing to serve the dashboard on 0.0.0.0" in cli.stderr
        and "STEADYTUNE_DASHBOARD_TOKEN" in cli.stderr
    )


@pytest.mark.parametrize(
    "path",
    ["/api/runs/../../etc", "/api/runs/..%2F..%2Fetc", "/run/..%2F..%2Fetc%2Fpasswd", "/api/runs/%2E%2E",
     "/api/runs/..%2f..%2fetc/series", "/static/..%2Frun.html", "/static/../../../../etc/passwd",
     "/api/runs/live-run%00/stream"],
)  # fmt: skip
def test_forged_run_ids_get_404(secured: DashboardHandle, path: str) -> None:
    status, _, body = request(secured, "GET", path)
    assert status == 404, (path, body[:200])
    assert b"root:" not in body


def test_read_api_open_controls_need_the_token_in_a_header(secured: DashboardHandle, runs_dir: Path) -> None:
    assert request(secured, "GET", "/api/runs/live-run")[0] == 200
    cmd = {"command": "pause", "issuer": "alice", "confirm": True}
    assert request(secured, "POST", "/api/runs/live-run/control", cmd)[0] == 401
    status, _, _ = request(secured, "POST", "/api/runs/live-run/control", cmd, {"Cookie": f"token={TOKEN}"})
    assert status == 401  # a cookie is never enough: the browser would send it cross-site
    assert (
        request(secured, "POST", "/api/runs/live-run/control", cmd, {"X-Steadytune-Token": "wrong"})[0] == 401
    )
    unconfirmed = {"command": "stop", "issuer": "alice"}
    assert (
        request(secured, "POST", "/api/runs/live-run/control", unconfirmed, {"X-Steadytune-Token": TOKEN})[0]
        == 400
    )
    anonymous = {"command": "stop", "confirm": True}
    assert (
        request(secured, "POST", "/api/runs/live-run/control", anonymous, {"X-Steadytune-Token": TOKEN})[0]
        == 400
    )
    status, _, body = request(
        secured, "POST", "/api/runs/live-run/control", cmd, {"X-Steadytune-Token": TOKEN}
    )
    assert status == 200, body
    (queued,) = (runs_dir / "live-run" / "control").iterdir()
    req = json.loads(queued.read_text())
    assert req["command"] == "pause" and req["issuer"] == "alice (dashboard, 127.0.0.1)"
    status, _, body = request(secured, "GET", "/api/auth", headers={"X-Steadytune-Token": TOKEN})
    assert json.loads(body) == {"controls": True, "authorized": True, "reads": "open"}


def test_no_token_means_no_controls(dashboard: DashboardHandle, live_run: LiveRun) -> None:
    cmd = {"command": "stop", "issuer": "mallory", "confirm": True}
    status, _, body = request(
        dashboard, "POST", "/api/runs/live-run/control", cmd, {"X-Steadytune-Token": "x" * 20}
    )
    assert status == 403 and b"controls are off" in body


def test_no_cors_and_no_dns_rebinding(secured: DashboardHandle) -> None:
    status, headers, _ = request(
        secured,
        "OPTIONS",
        "/api/runs/live-run/control",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert status == 405
    status, headers, _ = request(secured, "GET", "/api/runs", headers={"Origin": "http://evil.example"})
    assert status == 200 and not any(k.lower().startswith("access-control-") for k in headers)
    assert headers["X-Frame-Options"] == "DENY" and "default-src 'self'" in headers["Content-Security-Policy"]
    status, _, _ = request(secured, "GET", "/api/runs", headers={"Host": "evil.example:80"})
    assert status == 403


# ---- off loopback: reads need the token, Host is checked --------------------------------------

PUBLIC_URL = "https://dash.example/"
READS = [
    "/api/runs",
    "/api/runs/live-run",
    "/api/runs/live-run/series?points=50",
    "/api/runs/live-run/events",
    "/api/runs/live-run/gradflow",
    "/metrics",
]
STREAMS = ["/api/stream", "/api/runs/live-run/stream"]


@pytest.fixture
def exposed(runs_dir: Path, live_run: LiveRun) -> Iterator[DashboardHandle]:
    # Bound to 127.0.0.1 but classified as reachable from other machines, as 0.0.0.0 would be.
    handle = start_dashboard(
        runs_dir, host="127.0.0.1", port=0, token=TOKEN, exposed=True, public_url=PUBLIC_URL
    )
    yield handle
    handle.stop()


def test_off_loopback_every_read_needs_the_token(exposed: DashboardHandle) -> None:
    for path in READS:
        status, headers, body = request(exposed, "GET", path)
        assert status == 401, (path, body[:200])
        assert headers["WWW-Authenticate"].startswith("Bearer") and b"token" in body
        assert (
            request(exposed, "GET", path, headers={"X-Steadytune-Token": "wrong-token-0123456789"})[0] == 401
        )
        assert request(exposed, "GET", path, headers={"Cookie": f"token={TOKEN}"})[0] == 401
        assert request(exposed, "GET", path, headers={"X-Steadytune-Token": TOKEN})[0] == 200, path
        assert request(exposed, "GET", path, headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200, path
    for path in STREAMS:
        assert stream_status(exposed, path)[0] == 401
        assert stream_status(exposed, path, {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    # The pages themselves hold no data: they load, then ask for the token.
    for path in ["/", "/run/live-run", "/static/common.js", "/healthz"]:
        assert request(exposed, "GET", path)[0] == 200, path
    status, _, body = request(exposed, "GET", "/api/auth")
    assert status == 200 and json.loads(body) == {"controls": True, "authorized": False, "reads": "token"}


def test_off_loopback_host_must_be_ours(exposed: DashboardHandle) -> None:
    auth = {"X-Steadytune-Token": TOKEN}
    for host in ("evil.example", f"evil.example:{exposed.port}", "dash.example.evil.example", "", "a b"):
        status, _, body = request(exposed, "GET", "/api/runs", headers={**auth, "Host": host})
        assert status == 403 and b"public_url" in body, host
    for host in (
        "dash.example",
        "DASH.example:443",
        f"127.0.0.1:{exposed.port}",
        f"localhost:{exposed.port}",
    ):
        assert request(exposed, "GET", "/api/runs", headers={**auth, "Host": host})[0] == 200, host


def test_on_loopback_reads_stay_open(dashboard: DashboardHandle, live_run: LiveRun) -> None:
    for path in READS:
        assert request(dashboard, "GET", path)[0] == 200, path
    body = request(dashboard, "GET", "/api/auth")[2]
    assert json.loads(body) == {"controls": False, "authorized": False, "reads": "open"}


def test_exposed_without_a_token_is_refused(runs_dir: Path) -> None:
    with pytest.raises(BindRefused, match="no token is set"):
        start_dashboard(runs_dir, host="127.0.0.1", port=0, exposed=True)
    with pytest.raises(BindRefused, match="public_url"):
        start_dashboard(runs_dir, host="127.0.0.1", port=0, public_url=PUBLIC_URL)


# ---- timeouts and caps -----------------------------------------------------------------------


def handler_threads() -> int:
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def wait_for(cond: Callable[[], Any], timeout: float, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(every)
    return cond()


def stream_status(handle: DashboardHandle, path: str, headers: dict | None = None) -> tuple[int, dict]:
    """The status and headers of a stream (or of its refusal), without reading the stream."""
    conn = http.client.HTTPConnection("127.0.0.1", handle.port, timeout=ANSWER_S)
    conn.request("GET", path, headers=headers or {})
    resp = conn.getresponse()
    out = resp.status, dict(resp.getheaders())
    conn.close()
    return out


def read_all(sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """What the server sends until it closes the socket, and whether it did within ``timeout``."""
    sock.settimeout(0.05)
    data, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def test_idle_sockets_are_capped_and_closed_after_the_timeout(runs_dir: Path) -> None:
    handle = start_dashboard(runs_dir, host="127.0.0.1", port=0, request_timeout_s=0.5, max_connections=4)
    try:
        base = handler_threads()
        socks = [socket.create_connection(("127.0.0.1", handle.port), timeout=5) for _ in range(14)]
        peak, until = 0, time.monotonic() + 0.3
        while time.monotonic() < until:
            peak = max(peak, handler_threads() - base)
            time.sleep(0.01)
        assert peak <= 4, f"{peak} handler threads for 14 idle sockets, cap 4"
        results = [read_all(s, timeout=5) for s in socks]
        assert all(closed for _, closed in results), "an idle socket was still open 5 s after a 0.5 s timeout"
        refused = [data for data, _ in results if data]
        assert len(refused) >= 10 and all(
            d.startswith(b"HTTP/1.1 503") and b"Retry-After:" in d for d in refused
        )
        assert wait_for(lambda: handler_threads() <= base, 5)
        for s in socks:
            s.close()
        assert request(handle, "GET", "/healthz")[0] == 200  # and it still serves
    finally:
        handle.stop()


def test_a_request_trickled_a_byte_at_a_time_is_cut_at_the_deadline(runs_dir: Path) -> None:
    handle = start_dashboard(runs_dir, host="127.0.0.1", port=0, request_timeout_s=0.5)
    try:
        sock = socket.create_connection(("127.0.0.1", handle.port), timeout=5)
        start, sent = time.monotonic(), 0
        line = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{handle.port}\r\n" + "X-Slow: " + "a" * 200
        try:
            for ch in line:  # each byte well inside the timeout, the whole request far beyond it
                sock.sendall(ch.encode())
                sent += 1
                time.sleep(0.05)
                if time.monotonic() - start > 5:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        _, closed = read_all(sock, timeout=1)
        assert closed and time.monotonic() - start < 3, f"still open after {time.monotonic() - start:.1f} s"
        assert sent < len(line)
        sock.close()
    finally:
        handle.stop()


def test_streams_are_capped_with_retry_after(runs_dir: Path, live_run: LiveRun) -> None:
    handle = start_dashboard(runs_dir, host="127.0.0.1", port=0, max_streams=2, poll_s=0.05)
    try:
        # Each viewer keeps its response: a response object dropped closes the socket under it (the
        # stream answers "Connection: close"), the server sees the viewer gone at its next poll, and
        # on a loaded machine the slot was free again before the third request came.
        viewers = []
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", handle.port, timeout=ANSWER_S)
            conn.request("GET", "/api/runs/live-run/stream")
            resp = conn.getresponse()
            assert resp.status == 200
            viewers.append((conn, resp))
        status, headers = stream_status(handle, "/api/stream")
        assert status == 503 and int(headers["Retry-After"]) > 0
        assert request(handle, "GET", "/api/runs/live-run")[0] == 200  # other requests are still served
        conn, resp = viewers.pop()  # a viewer leaves: its slot frees without waiting for a keep-alive
        resp.close()
        conn.close()
        assert wait_for(lambda: stream_status(handle, "/api/stream")[0] == 200, 5, every=0.1)
        for conn, resp in viewers:
            resp.close()
            conn.close()
    finally:
        handle.stop()


# ---- malformed input: 400 naming the parameter, never a dropped connection -----------------------


@pytest.mark.parametrize(
    ("path", "param"),
    [("/api/runs/live-run/series?points=inf", "points"), ("/api/runs/live-run/series?points=nan", "points"),
     ("/api/runs/live-run/gradflow?points=inf", "points"), ("/api/runs/live-run/series?lo=nan", "lo"),
     ("/api/runs/live-run/series?hi=-inf", "hi"), ("/api/runs/live-run/series?gpus=0,x", "gpus"),
     ("/api/runs/live-run/series?gpus=-1", "gpus"), ("/api/runs/live-run/events?after=inf", "after"),
     ("/api/runs/live-run/events?after=1e400", "after"), ("/api/runs/live-run/events?after=abc", "after"),
     ("/api/runs/live-run/events?after=99999999999999999999999", "after"),
     ("/api/runs/live-run/stream?since=nan", "since"), ("/api/runs/live-run/stream?after=inf", "after")],
)  # fmt: skip
def test_malformed_query_values_get_400_naming_them(
    secured: DashboardHandle, capfd: pytest.CaptureFixture[str], path: str, param: str
) -> None:
    status, headers, body = request(secured, "GET", path)
    assert status == 400 and headers["Content-Type"] == "application/json", (path, body[:200])
    error = json.loads(body)
    assert error["param"] == param and param in error["error"]
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("length", ["abc", "-5", "1e3", ""])
def test_malformed_content_length_gets_400(secured: DashboardHandle, capfd: pytest.CaptureFixture[str],
                                           length: str) -> None:  # fmt: skip
    sock = socket.create_connection(("127.0.0.1", secured.port), timeout=5)
    sock.sendall(
        f"POST /api/runs/live-run/control HTTP/1.1\r\nHost: 127.0.0.1:{secured.port}\r\n"
        f"X-Steadytune-Token: {TOKEN}\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n{{}}".encode()
    )
    data = read_all(sock, timeout=ANSWER_S)[0]
    sock.close()
    assert data.startswith(b"HTTP/1.1 400"), data[:200]
    body = json.loads(data.partition(b"\r\n\r\n")[2])
    assert "Content-Length" in body["error"] and body["param"] == "Content-Length"
    assert "Traceback" not in capfd.readouterr().err

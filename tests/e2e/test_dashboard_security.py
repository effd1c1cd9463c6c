"""Security over real sockets: bind policy, forged run ids, tokens in headers only, no CORS."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_run import LiveRun

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
    conn = http.client.HTTPConnection("127.0.0.1", handle.port, timeout=10)
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
        [sys.executable, "-m", "steadytune.cli.main", "dashboard", str(runs_dir), "--host", "0.0.0.0", "--port", "0"],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
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
    req = json.loads((runs_dir / "live-run" / "control.json").read_text())
    assert req["command"] == "pause" and req["issuer"] == "alice (dashboard, 127.0.0.1)"
    status, _, body = request(secured, "GET", "/api/auth", headers={"X-Steadytune-Token": TOKEN})
    assert json.loads(body) == {"controls": True, "authorized": True}


def test_no_token_means_no_controls(dashboard: DashboardHandle, live_run: LiveRun) -> None:
    cmd = {"command": "stop", "issuer": "mallory", "confirm": True}
    status, _, body = request(
        dashboard, "POST", "/api/runs/live-run/control", cmd, {"X-Steadytune-Token": "x" * 20}
    )
    assert status == 403 and b"controls are off" in body


def test_no_cors_and_no_dns_rebinding(secured: DashboardHandle) -> None:
    status, headers, _ = request(secured, "OPTIONS", "/api/runs/live-run/control",
                                 headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})  # fmt: skip
    assert status == 405
    status, headers, _ = request(secured, "GET", "/api/runs", headers={"Origin": "http://evil.example"})
    assert status == 200 and not any(k.lower().startswith("access-control-") for k in headers)
    assert headers["X-Frame-Options"] == "DENY" and "default-src 'self'" in headers["Content-Security-Policy"]
    status, _, _ = request(secured, "GET", "/api/runs", headers={"Host": "evil.example:80"})
    assert status == 403

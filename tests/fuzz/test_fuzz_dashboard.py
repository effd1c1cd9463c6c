"""The dashboard's request parsing: query values, headers, paths and methods, on a live server.

Documented clean errors: :class:`~steadytune.web.params.BadParam` from the parsers; over HTTP,
any 4xx, and 501 for a method it does not serve. A 500 (an exception in a handler) or a
dropped connection is a crash. Every answer
carries the security headers.
"""

from __future__ import annotations

import http.client
import urllib.parse
from collections.abc import Iterator
from email.message import Message

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from steadytune.records import Event, StepRecord
from steadytune.rundir import RunDir
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web import routes
from steadytune.web.params import BadParam, content_length, query_float, query_int
from steadytune.web.server import DashboardHandle, start_dashboard
from tests.fuzz.conftest import cases
from tests.fuzz.strategies import number_text
from tests.waiting import ANSWER_S

TOKEN = "fuzz-token-0123456789abcdef"
values = number_text | st.text(max_size=12) | st.sampled_from(["%00", "%2e%2e", "1" * 30, "-0", "1e-400"])
queries = st.dictionaries(
    st.sampled_from(["points", "lo", "hi", "step", "after", "since", "x"]), values, max_size=4
)
segments = st.sampled_from(
    [
        "api",
        "runs",
        "r1",
        "series",
        "gradflow",
        "gradhist",
        "events",
        "static",
        "run",
        "server",
        "jobs",
        "j1",
        "cancel",
        "control",
        "metrics",
        "healthz",
        "auth",
        "common.js",
        "..",
        "%2e%2e",
        "%2F",
        "%00",
        "r1%00",
        "",
        "index.html",
        "x" * 300,
    ]
)


@cases(300)
@given(queries, st.sampled_from(["points", "lo", "hi", "step"]), st.integers(-(2**60), 2**60))
def test_query_values_are_numbers_or_bad_params(query: dict[str, str], name: str, bound: int) -> None:
    q = {k: [v] for k, v in query.items()}
    for parse in (
        lambda: query_float(q, name),
        lambda: query_int(q, name, 0, lo=min(bound, 0), hi=max(bound, 0)),
    ):
        try:
            parse()
        except BadParam as exc:
            assert exc.param == name


@cases(200)
@given(st.text(max_size=30))
def test_a_content_length_is_a_byte_count_or_a_bad_param(raw: str) -> None:
    headers = Message()
    headers["Content-Length"] = raw.replace("\n", " ").replace("\r", " ")
    try:
        assert content_length(headers) >= 0
    except BadParam as exc:
        assert exc.param == "Content-Length"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardHandle]:
    runs = tmp_path_factory.mktemp("runs")
    run = RunDir(runs / "r1").create()
    writer = JsonlWriter(run.telemetry(0))
    for s in range(1, 30):
        writer.write(StepRecord(step=s, ts=float(s), loss=1.0 / s, grad_norm=1.0))
    EventLog(run.events, "r1", audit=False).append(Event(ts=1.0, kind="lifecycle", name="run_started"))
    handle = start_dashboard(runs, host="127.0.0.1", port=0, token=TOKEN, poll_s=0.05)
    yield handle
    handle.stop()


@cases(150)
@given(
    st.sampled_from(["GET", "HEAD", "POST", "OPTIONS", "PUT", "DELETE"]),
    st.lists(segments, max_size=5).map("/".join),
    queries,
    st.fixed_dictionaries(
        {},
        optional={
            "Host": st.sampled_from(["127.0.0.1", "evil.example", "", "[::1]:1", "a b"]),
            "X-Steadytune-Token": st.sampled_from([TOKEN, "wrong", ""]),
            "Content-Length": st.sampled_from(["5", "-1", "abc", "99999999999999999999"]),
        },
    ),
    st.binary(max_size=100),
)
def test_any_request_gets_an_answer_below_500_with_the_security_headers(
    live: DashboardHandle, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes
) -> None:
    if "stream" in path:
        return  # a stream stays open: its parameters are the parsers' above
    query_text = "&".join(f"{k}={urllib.parse.quote(v, safe='%')}" for k, v in query.items())
    target = "/" + path + ("?" + query_text if query else "")
    routes.find(method, target)  # the router itself never raises
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=ANSWER_S)
    try:
        conn.putrequest(method, target.replace(" ", "%20"), skip_host="Host" in headers)
        for k, v in headers.items():
            conn.putheader(k, v)
        if "Content-Length" not in headers and method in ("POST", "PUT"):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body if method in ("POST", "PUT") else None)
        resp = conn.getresponse()
        resp.read()
    except (TimeoutError, http.client.RemoteDisconnected, ConnectionResetError) as exc:
        raise AssertionError(f"{method} {target} {headers}: no answer ({exc!r})") from None
    finally:
        conn.close()
    event(f"HTTP {resp.status}")
    assert resp.status < 500 or resp.status == 501, (method, target, headers, resp.status)  # 501: PUT, DELETE
    assert resp.getheader("X-Content-Type-Options") == "nosniff" and resp.getheader("Content-Security-Policy")

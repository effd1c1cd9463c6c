"""Sinks against real local servers (127.0.0.1 only): a webhook that redirects, an alert title with CR/LF.

A webhook URL is only ever POSTed to, over http or https: a redirect is not followed
(to file:, ftp:, nor even another http URL, where the POST would silently become a
GET and the alert count as delivered). An e-mail header with CR/LF in it is made
one line, so the alert goes out once instead of failing every retry.
"""

from __future__ import annotations

import base64
import email
import email.policy
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tests.waiting import ANSWER_S

from steadytune.alerts.message import test_alert as make_test_alert
from steadytune.alerts.router import AlertRouter
from steadytune.alerts.secrets import SecretError
from steadytune.alerts.sinks import DeliveryError, build_sinks
from steadytune.config.alerts import AlertsConfig
from steadytune.records import Event
from steadytune.redact import Redactor
from steadytune.telemetry.events import EventLog, read_events


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Redirector:
    """Answers every POST with a redirect to ``target``; records every request it gets."""

    def __init__(self, code: int = 302) -> None:
        self.requests: list[tuple[str, str]] = []
        self.auth: list[str | None] = []  # each request's Authorization header
        self.code, self.target = code, ""
        srv = self

        class H(BaseHTTPRequestHandler):
            def _any(self) -> None:
                srv.requests.append((self.command, self.path))
                srv.auth.append(self.headers.get("Authorization"))
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                if self.path.startswith("/hook"):
                    self.send_response(srv.code)
                    self.send_header("Location", srv.target)
                else:
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_HEAD = _any

            def log_message(self, *a: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture()
def redirector() -> Iterator[Redirector]:
    r = Redirector()
    yield r
    r.close()


def webhook_sinks(url: str, **conf):
    config = AlertsConfig.model_validate(
        {"sinks": [{"type": "webhook", "url_env": "HOOK", "timeout_s": ANSWER_S}], **conf}
    )
    return config, build_sinks(config, Redactor(), environ={"HOOK": url})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_credentials_in_a_webhook_url_go_as_basic_auth(redirector: Redirector) -> None:
    # urllib took "bot:p@ss@127.0.0.1" for a host name: every delivery failed "Name or service not
    # known". The credentials now go in an Authorization header, and never into an error text.
    url = redirector.base.replace("://", "://bot:p%40ss-w0rd@") + "/ok"
    _, (sink,) = webhook_sinks(url)
    sink.send(make_test_alert("r1", now=1.0))
    assert redirector.requests == [("POST", "/ok")]
    assert redirector.auth == ["Basic " + base64.b64encode(b"bot:p@ss-w0rd").decode()]
    redirector.code = 500
    bad = url.replace("/ok", "/hook")
    _, (failing,) = webhook_sinks(bad)
    with pytest.raises(DeliveryError) as exc:
        failing.send(make_test_alert("r1", now=1.0))
    assert "HTTP 500" in str(exc.value) and "ss-w0rd" not in str(exc.value)


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("target", ["file:///etc/passwd", "ftp://127.0.0.1:{closed}/x", "{base}/elsewhere"])
def test_webhook_redirect_is_not_followed(redirector: Redirector, code: int, target: str) -> None:
    redirector.code = code
    redirector.target = target.format(base=redirector.base, closed=closed_port())
    _, (sink,) = webhook_sinks(f"{redirector.base}/hook/T000-secret-path")
    with pytest.raises(DeliveryError) as exc:
        sink.send(make_test_alert("r1"))
    message = str(exc.value)
    assert f"HTTP {code}" in message and "redirect" in message and "not followed" in message
    assert "root:" not in message and "secret-path" not in message
    assert redirector.requests == [("POST", "/hook/T000-secret-path")]  # nothing else was asked for


def test_redirected_alert_is_recorded_undelivered_at_once(redirector: Redirector, tmp_path: Path) -> None:
    redirector.target = "file:///etc/passwd"
    config, sinks = webhook_sinks(f"{redirector.base}/hook/x", retry={"attempts": 5, "backoff_s": 1})
    clock = Clock()
    log = EventLog(tmp_path / "events.jsonl", run_id="r1", clock=clock)
    router = AlertRouter(config, log, clock=clock, run_id="r1", sinks=sinks, start=False)
    router.submit(Event(ts=1.0, kind="anomaly", name="nan_loss", severity="critical", step=3))
    router.pump()
    (alert,) = [e for e in read_events(log.path) if e.kind == "alert"]
    assert alert.data["status"] == "undelivered" and alert.data["attempts"] == {"webhook": 1}
    assert "redirect" in alert.data["undelivered"]["webhook"]
    assert router.next_due() is None  # not retried: a redirect is the URL's fault, not the network's
    assert len(redirector.requests) == 1


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://127.0.0.1/x", "gopher://127.0.0.1/x", "127.0.0.1/x"]
)
def test_webhook_url_must_be_http_or_https(url: str) -> None:
    with pytest.raises(SecretError, match="http:// or https://") as exc:
        webhook_sinks(url)
    assert "passwd" not in str(exc.value)


# ---- e-mail ------------------------------------------------------------------------------


@pytest.fixture()
def smtp() -> Iterator[dict]:
    from aiosmtpd.controller import Controller

    got: dict = {"envelopes": []}

    class Handler:
        async def handle_DATA(self, server, session, envelope):
            got["envelopes"].append(envelope)
            return "250 OK"

    port = closed_port()  # aiosmtpd checks readiness by connecting, so it needs a real port
    controller = Controller(Handler(), hostname="127.0.0.1", port=port, ready_timeout=10)
    controller.start()
    got["port"] = port
    yield got
    controller.stop()


def test_crlf_in_an_email_subject_is_sent_once_on_one_line(smtp: dict, tmp_path: Path) -> None:
    config = AlertsConfig.model_validate(
        {
            "retry": {"attempts": 3, "backoff_s": 1},
            "sinks": [
                {"type": "email", "host": "127.0.0.1", "port": smtp["port"], "security": "none",
                 "sender": "bot@example.com", "to": ["oncall@example.com"], "timeout_s": ANSWER_S},
            ],
        }
    )  # fmt: skip
    clock = Clock()
    log = EventLog(tmp_path / "events.jsonl", run_id="r1", clock=clock)
    router = AlertRouter(config, log, clock=clock, run_id="r1", start=False)
    router.submit(Event(ts=1.0, kind="anomaly", name="nan_loss\r\nBcc: x@y", severity="critical", step=3))
    router.pump()
    (alert,) = [e for e in read_events(log.path) if e.kind == "alert"]
    assert alert.data["status"] == "delivered" and alert.data["attempts"] == {"email": 1}, alert.data
    (envelope,) = smtp["envelopes"]
    assert envelope.rcpt_tos == ["oncall@example.com"]
    msg = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
    assert msg["Bcc"] is None and "x@y" not in msg["To"]
    subject = msg["Subject"]
    assert "\r" not in subject and "\n" not in subject and "nan_loss" in subject and "Bcc: x@y" in subject
    header_lines = envelope.original_content.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
    assert not any(line.lower().startswith(b"bcc") for line in header_lines)


@pytest.mark.parametrize(
    "brk",
    ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c\x1d\x1e"],
    ids=["LS", "PS", "NEL", "VT", "FF", "FS-RS"],
)
def test_a_unicode_line_break_in_a_run_name_or_title_leaves_every_header_one_line(
    smtp: dict, tmp_path: Path, brk: str
) -> None:
    """The email package refuses a header holding any character str.splitlines() breaks at; the
    header was cleaned of C0 controls only, so U+2028 or U+0085 in a run's name or an anomaly's
    text failed every retry and the alert was lost."""
    config = AlertsConfig.model_validate(
        {
            "retry": {"attempts": 2, "backoff_s": 1},
            "sinks": [
                {"type": "email", "host": "127.0.0.1", "port": smtp["port"], "security": "none",
                 "sender": "bot@example.com", "to": ["oncall@example.com"], "timeout_s": ANSWER_S,
                 "subject_prefix": f"[st{brk}Cc: a@b]"},
            ],
        }
    )  # fmt: skip
    clock = Clock()
    run = f"exp{brk}Bcc: x@y"
    log = EventLog(tmp_path / "events.jsonl", run_id=run, clock=clock)
    router = AlertRouter(config, log, clock=clock, run_id=run, start=False)
    router.submit(Event(ts=1.0, kind="anomaly", name=f"nan_loss{brk}X-Evil: 1", severity="critical", step=3))
    router.pump()
    (alert,) = [e for e in read_events(log.path) if e.kind == "alert"]
    assert alert.data["status"] == "delivered" and alert.data["attempts"] == {"email": 1}, alert.data
    (envelope,) = smtp["envelopes"]
    msg = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
    assert msg["Bcc"] is None and msg["Cc"] is None and msg["X-Evil"] is None
    for name, value in msg.items():
        assert len(str(value).splitlines()) == 1, (name, value)
    assert str(msg["Subject"]) == "[st Cc: a@b] CRITICAL nan_loss X-Evil: 1 in exp Bcc: x@y at step 3"


def test_an_email_has_date_and_message_id_and_states_cause_and_fix_once(smtp: dict, tmp_path: Path) -> None:
    config = AlertsConfig.model_validate(
        {
            "sinks": [
                {"type": "email", "host": "127.0.0.1", "port": smtp["port"], "security": "none",
                 "sender": "Steadytune <bot@example.com>", "to": ["oncall@example.com"],
                 "timeout_s": ANSWER_S},
            ],
        }
    )  # fmt: skip
    clock = Clock()
    log = EventLog(tmp_path / "events.jsonl", run_id="r1", clock=clock)
    router = AlertRouter(config, log, clock=clock, run_id="r1", start=False)
    cause, fix = "one batch far off the data", "lower the learning rate"
    router.submit(
        Event(ts=1_700_000_000.0, kind="anomaly", name="loss_spike", severity="warning", step=3,
              message=f"WARNING loss_spike at step 3: loss spike on loss. Likely cause: {cause}. Try: {fix}.",
              data={"cause": cause, "suggestion": fix})
    )  # fmt: skip
    router.pump()
    (envelope,) = smtp["envelopes"]
    msg = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
    assert msg["Date"].datetime.timestamp() == 1_700_000_000.0
    assert re.fullmatch(r"<[^<>@\s]+@example\.com>", msg["Message-ID"])
    body = msg.get_content()
    assert body.count(cause) == 1 and body.count(fix) == 1

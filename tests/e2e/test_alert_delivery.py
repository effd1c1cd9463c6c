"""Alerts reach real local servers: a Slack-format webhook over HTTP, e-mail over SMTP
with STARTTLS + AUTH (aiosmtpd). The secrets appear in no log, no event and no page."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.servers import Hook
from tests.waiting import ANSWER_S, wait_for

from conftest import require
from steadytune.alerts.router import AlertRouter
from steadytune.cli.main import main
from steadytune.config.alerts import AlertsConfig
from steadytune.records import Event
from steadytune.rundir import RunDir
from steadytune.telemetry.events import EventLog
from steadytune.web.server import start_dashboard

pytestmark = pytest.mark.slow

HOOK_SECRET = "T0000/B0000/XyZwebhookSECRET123"
SMTP_PASSWORD = "correct-horse-SMTP-secret-77"


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook(path=f"/services/{HOOK_SECRET}")
    yield h
    h.close()


@pytest.fixture
def smtp(tmp_path: Path) -> Iterator[dict]:
    """aiosmtpd with a self-signed certificate, STARTTLS required, AUTH checked."""
    import ssl

    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    openssl = require("openssl", "openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    got: dict = {"messages": [], "auth": [], "cert": cert}

    class Handler:
        async def handle_DATA(self, server, session, envelope):
            got["messages"].append(envelope.content.decode("utf-8", "replace"))
            return "250 OK"

    def authenticator(server, session, envelope, mechanism, auth_data):
        ok = auth_data.login == b"bot@example.com" and auth_data.password == SMTP_PASSWORD.encode()
        got["auth"].append(ok)
        return AuthResult(success=ok)

    with socket.socket() as probe:  # aiosmtpd checks readiness by connecting, so it needs a real port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(
        Handler(), hostname="127.0.0.1", port=port, tls_context=ctx, require_starttls=True,
        authenticator=authenticator, auth_require_tls=True,
    )  # fmt: skip
    controller.start()
    got["port"] = port
    yield got
    controller.stop()


def _config(hook: Hook, smtp: dict) -> dict:
    return {
        "min_severity": "warning",
        "retry": {"attempts": 4, "backoff_s": 0.2, "max_backoff_s": 1},
        "sinks": [
            {"type": "webhook", "format": "slack", "url_env": "TEST_SLACK_HOOK"},
            {"type": "email", "host": "127.0.0.1", "port": smtp["port"], "security": "starttls",
             "username": "bot@example.com", "password_env": "TEST_SMTP_PASSWORD", "sender": "bot@example.com",
             "to": ["oncall@example.com"], "ca_file": str(smtp["cert"])},
            {"type": "console"},
        ],
    }  # fmt: skip


def test_anomaly_reaches_slack_and_email_and_no_secret_leaks(
    hook: Hook, smtp: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TEST_SLACK_HOOK", hook.url)
    monkeypatch.setenv("TEST_SMTP_PASSWORD", SMTP_PASSWORD)
    hook.fail_first = 1  # the first POST fails: delivery is retried with backoff
    runs = tmp_path / "runs"
    run = RunDir(runs / "r-alerts").create()
    log = EventLog(run.events, run_id="r-alerts")
    router = AlertRouter(AlertsConfig.model_validate(_config(hook, smtp)), log, run_id="r-alerts")
    log.on_append = router  # as the supervisor wires it
    hook.release.clear()  # the webhook holds its first request until the append has returned
    log.append(Event(ts=time.time(), kind="anomaly", name="loss_spike", severity="critical", step=42,
                     message="loss 3.1 is 2.4x the window mean",
                     data={"metric": "loss", "cause": "a batch of very long samples",
                           "suggestion": "roll back to LAST_GOOD and skip the window"}))  # fmt: skip
    # Appending (and so training) does not wait for delivery: it returned while the webhook holds the alert.
    assert hook.bodies == [] and [json.loads(x)["kind"] for x in run.events.read_text().splitlines()] == [
        "anomaly"
    ]
    wait_for(hook.held.is_set, timeout=30, what="the webhook to receive the alert")
    hook.release.set()
    wait_for(
        lambda: hook.bodies and smtp["messages"], timeout=60, what="delivery to the webhook and by e-mail"
    )
    router.close(timeout=10)

    (slack,) = hook.bodies
    assert slack["text"].endswith("CRITICAL loss_spike in r-alerts at step 42")
    fields = {f["title"]: f["value"] for f in slack["attachments"][0]["fields"]}
    assert fields["fix"] == "roll back to LAST_GOOD and skip the window" and fields["step"] == "42"
    (mail,) = smtp["messages"]
    assert "Subject: [steadytune] CRITICAL loss_spike in r-alerts at step 42" in mail
    assert "cause: a batch of very long samples" in mail
    assert smtp["auth"] == [True]

    events = [json.loads(x) for x in run.events.read_text().splitlines()]
    alert = events[-1]
    assert alert["kind"] == "alert" and alert["data"]["status"] == "delivered"
    assert sorted(alert["data"]["delivered"]) == ["console", "email", "webhook"]
    assert alert["data"]["attempts"]["webhook"] == 2

    handle = start_dashboard(runs, port=0)
    try:
        pages = [
            urllib.request.urlopen(handle.url + p, timeout=ANSWER_S).read().decode()
            for p in ("api/runs/r-alerts", "api/runs/r-alerts/events", "metrics", "run/r-alerts", "api/runs")
        ]
    finally:
        handle.stop()
    out, err = capfd.readouterr()
    haystacks = [run.events.read_text(), out, err, *pages]
    for secret in (HOOK_SECRET, SMTP_PASSWORD, hook.url):
        assert not any(secret in h for h in haystacks), f"secret leaked: {secret[:6]}…"
    assert "CRITICAL loss_spike" in err  # the console sink did print the alert


def test_undeliverable_alert_is_marked_in_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A port nobody listens on: every try is refused.
    dead = Hook()
    url = dead.url
    dead.close()
    monkeypatch.setenv("TEST_SLACK_HOOK", url)
    run = RunDir(tmp_path / "r").create()
    log = EventLog(run.events, run_id="r")
    conf = {"retry": {"attempts": 3, "backoff_s": 0.05, "max_backoff_s": 0.1},
            "sinks": [{"type": "webhook", "format": "discord", "url_env": "TEST_SLACK_HOOK"}]}  # fmt: skip
    router = AlertRouter(AlertsConfig.model_validate(conf), log)
    router.submit(Event(ts=time.time(), kind="anomaly", name="nan_loss", severity="critical", step=7))
    wait_for(lambda: router.recorded, timeout=30, what="the undeliverable alert to be recorded")
    router.close(timeout=5)
    (event,) = [json.loads(x) for x in run.events.read_text().splitlines()]
    assert event["kind"] == "alert" and event["data"]["status"] == "undelivered"
    assert event["data"]["attempts"] == {"webhook": 3}
    assert HOOK_SECRET not in run.events.read_text()


def test_alert_test_command_sends_through_every_sink(
    hook: Hook,
    smtp: dict,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import yaml

    monkeypatch.setenv("TEST_SLACK_HOOK", hook.url)
    monkeypatch.setenv("TEST_SMTP_PASSWORD", SMTP_PASSWORD)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"model": "tiny", "alerts": _config(hook, smtp)}))
    assert main(["alert", "test", str(cfg), "--show-config"]) == 0
    out = capsys.readouterr()
    assert "3 of 3 sink(s) delivered the test alert" in out.out
    assert len(hook.bodies) == 1 and len(smtp["messages"]) == 1
    assert "steadytune test alert" in hook.bodies[0]["text"]
    assert HOOK_SECRET not in out.out + out.err and SMTP_PASSWORD not in out.out + out.err
    assert "TEST_SLACK_HOOK" in out.out  # the config dump names the reference, not the value


def test_clear_secret_in_yaml_is_refused_by_alert_test(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "alerts:\n  sinks:\n    - type: webhook\n      url: https://hooks.slack.com/services/T/B/clearSECRET\n"
    )
    assert main(["alert", "test", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert (
        "alerts.sinks.0.url: holds a secret in clear" in err
        and "url_env: NAME" in err
        and "clearSECRET" not in err
    )


def test_a_real_run_alerts_by_webhook_and_email_while_prometheus_scrapes_it(
    hook: Hook, smtp: dict, tmp_path: Path, demo_assets: Path, prometheus_bins: tuple[str, str]
) -> None:
    """A real supervised run (no stand-in): an LR far too high raises real anomalies, the alert
    router delivers them to the local webhook and SMTP server, and a real Prometheus scrapes the
    dashboard the supervisor serves, whose exposition promtool accepts.

    LoRA on the demo at LR 0.3 without clipping blows up in some runs and not in others (the same
    config: a gradient explosion at step 31 in one, a calm 300 steps in another), so the LR is also
    raised for a few steps at step 40 (the drill's own LR burst): the trouble comes in every run."""
    import os

    import yaml

    from steadytune.cli.demo import demo_config

    prometheus, promtool = prometheus_bins
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cfg = demo_config(demo_assets, str(tmp_path / "runs"), 300, "lora")
    cfg["train"].update({"learning_rate": 0.3, "max_grad_norm": 0.0, "logging_steps": 1})
    cfg["run"]["name"] = "alarming"
    alerts = _config(hook, smtp)
    alerts["sinks"] = [s for s in alerts["sinks"] if s["type"] != "console"]
    cfg["alerts"] = alerts
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    env = {
        **os.environ,
        "TEST_SLACK_HOOK": hook.url,
        "TEST_SMTP_PASSWORD": SMTP_PASSWORD,
        "OMP_NUM_THREADS": "1",
        "STEADYTUNE_FAULTS": json.dumps({"lr_burst_at_step": 40}),
    }
    exe = str(Path(__import__("sys").executable).with_name("steadytune"))
    console = open(tmp_path / "console.txt", "w")  # noqa: SIM115 - a file, not a pipe nobody drains
    run = subprocess.Popen([exe, "run", str(cfg_path), "--skip-check", "--dashboard", "--port", str(port)],
                           stdout=console, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    prom_port = port + 1 if port < 65000 else port - 1
    scrape = tmp_path / "prometheus.yml"
    scrape.write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: steadytune\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
    )
    prom = subprocess.Popen(
        [prometheus, f"--config.file={scrape}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        run_dir = wait_for(
            lambda: next((tmp_path / "runs").glob("alarming-*"), None), timeout=120, what="the run"
        )

        def exposition() -> bytes | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read()
            except OSError:
                return None
            return text if f'steadytune_step{{run="{run_dir.name}"}}'.encode() in text else None

        text = wait_for(exposition, timeout=180, what="the live run on /metrics")
        check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30)
        assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()

        def stored() -> list:
            url = f"http://127.0.0.1:{prom_port}/api/v1/query?query=steadytune_step"
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    result = json.loads(r.read())["data"]["result"]
            except OSError:
                return []
            return [x for x in result if x["metric"].get("run") == run_dir.name and float(x["value"][1]) > 0]

        wait_for(stored, timeout=120, interval=0.5, what="Prometheus to store the live run's step")
        run.wait(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
        prom.terminate()
        prom.wait(10)
        console.close()
    out = (tmp_path / "console.txt").read_text()
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    anomalies = [e for e in events if e["kind"] == "anomaly" and e["severity"] in ("warning", "critical")]
    assert anomalies, out
    wait_for(lambda: hook.bodies and smtp["messages"], timeout=60, what="the alerts to arrive")
    first = anomalies[0]["name"]
    assert any(first in json.dumps(b) for b in hook.bodies)
    assert any(f"{first} in {run_dir.name}" in m for m in smtp["messages"])
    delivered = [e for e in events if e["kind"] == "alert" and e["data"].get("status") == "delivered"]
    assert delivered and all(set(e["data"]["delivered"]) == {"webhook", "email"} for e in delivered[:1])

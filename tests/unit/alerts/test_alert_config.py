"""Alert config: secrets only by reference, clear errors naming the key and the fix."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from steadytune.alerts.message import alert_from_event, discord_payload, slack_payload
from steadytune.alerts.secrets import SecretError, resolve_secret
from steadytune.alerts.sinks import (
    CommandAlertSink,
    ConsoleAlertSink,
    DeliveryError,
    JsonlAlertSink,
    build_sinks,
)
from steadytune.config.alerts import AlertsConfig
from steadytune.records import Event
from steadytune.redact import Redactor, redact_url

HOOK = "https://hooks.slack.com/services/T0/B0/abcdefSECRET"


def test_clear_webhook_url_is_rejected_naming_key_and_fix() -> None:
    with pytest.raises(ValidationError) as err:
        AlertsConfig.model_validate({"sinks": [{"type": "webhook", "format": "slack", "url": HOOK}]})
    text = str(err.value)
    assert "sinks.0.webhook" in text and "`url:`" in text and "url_env: NAME" in text
    assert "abcdefSECRET" not in text.split("input_value")[0]


def test_clear_password_is_rejected() -> None:
    with pytest.raises(ValidationError, match="password_env: NAME"):
        AlertsConfig.model_validate(
            {
                "sinks": [
                    {"type": "email", "host": "h", "sender": "a@b", "to": ["c@d"], "password": "hunter22"}
                ]
            }
        )


def test_unknown_keys_are_rejected() -> None:
    with pytest.raises(ValidationError, match="Extra inputs"):
        AlertsConfig.model_validate({"min_sevrity": "info"})


def test_webhook_needs_exactly_one_reference() -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        AlertsConfig.model_validate({"sinks": [{"type": "webhook"}]})


def test_secrets_resolve_from_env_and_file(tmp_path: Path) -> None:
    assert resolve_secret("url", "HOOK", None, {"HOOK": HOOK}) == HOOK
    secret = tmp_path / "pw"
    secret.write_text("s3cret-pass\n")
    secret.chmod(0o600)
    assert resolve_secret("password", None, secret, {}) == "s3cret-pass"
    with pytest.raises(SecretError, match="url_env: environment variable NOPE is not set"):
        resolve_secret("url", "NOPE", None, {})
    with pytest.raises(SecretError, match="password_file"):
        resolve_secret("password", None, tmp_path / "missing", {})


def test_redactor_masks_secret_and_encoded_forms() -> None:
    r = Redactor()
    r.add(HOOK)
    r.add("p@ss word!")
    assert "abcdefSECRET" not in r.redact(f"error posting {HOOK}: 404")
    assert r.redact("pw=p%40ss%20word%21") == "pw=***"
    assert r.redact("/services/T0/B0/abcdefSECRET timed out") == "*** timed out"
    assert redact_url(HOOK) == "https://hooks.slack.com/***"
    assert r.redact_obj({"a": [HOOK]}) == {"a": ["***"]}


def test_dump_holds_only_references() -> None:
    conf = AlertsConfig.model_validate({"sinks": [{"type": "webhook", "url_env": "SLACK_URL"}]})
    dump = json.dumps(conf.redacted_dump())
    assert "SLACK_URL" in dump and "https" not in dump


def test_build_sinks_reads_secrets_and_registers_them(tmp_path: Path) -> None:
    conf = AlertsConfig.model_validate({"sinks": [{"type": "webhook", "format": "slack", "url_env": "HOOK"}]})
    redactor = Redactor()
    (sink,) = build_sinks(conf, redactor, environ={"HOOK": HOOK})
    assert redactor.redact(HOOK) == "***"
    assert "SECRET" not in sink.describe()  # type: ignore[attr-defined]


def _alert():
    return alert_from_event(
        Event(ts=5.0, kind="anomaly", name="loss_spike", severity="critical", step=7, message="loss 9.1",
              data={"metric": "loss", "cause": "bad batch", "suggestion": "roll back"}),
        run_id="r1", dashboard_url="http://127.0.0.1:7860/run/r1",
    )  # fmt: skip


def test_payload_formats() -> None:
    s = slack_payload(_alert())
    assert s["text"].endswith("CRITICAL loss_spike in r1 at step 7")
    assert s["attachments"][0]["title_link"] == "http://127.0.0.1:7860/run/r1"
    assert {"title": "fix", "value": "roll back", "short": False} in s["attachments"][0]["fields"]
    d = discord_payload(_alert())
    assert d["embeds"][0]["color"] == 0xEF4444 and d["content"].startswith("CRITICAL")


def test_console_and_jsonl_sinks(tmp_path: Path) -> None:
    conf = AlertsConfig.model_validate({"sinks": [{"type": "console"}, {"type": "jsonl", "path": "a.jsonl"}]})
    buf = io.StringIO()
    console = ConsoleAlertSink(conf.sinks[0], Redactor(), stream=buf)  # type: ignore[arg-type]
    console.send(_alert())
    assert (
        "[steadytune critical] CRITICAL loss_spike" in buf.getvalue() and "fix: roll back" in buf.getvalue()
    )
    jsonl = JsonlAlertSink(conf.sinks[1], Redactor(), base_dir=tmp_path)  # type: ignore[arg-type]
    jsonl.send(_alert())
    assert json.loads((tmp_path / "a.jsonl").read_text())["name"] == "loss_spike"


def test_command_sink_gets_json_on_stdin_and_reports_failure(tmp_path: Path) -> None:
    out = tmp_path / "got.json"
    script = f"import sys; open({str(out)!r}, 'w').write(sys.stdin.read())"
    conf = AlertsConfig.model_validate(
        {"sinks": [{"type": "command", "argv": [sys.executable, "-c", script]}]}
    )
    CommandAlertSink(conf.sinks[0], Redactor()).send(_alert())  # type: ignore[arg-type]
    assert json.loads(out.read_text())["cause"] == "bad batch"
    bad = AlertsConfig.model_validate(
        {"sinks": [{"type": "command", "argv": [sys.executable, "-c", "import sys; sys.exit('nope')"]}]}
    )
    with pytest.raises(DeliveryError, match="exited 1: nope"):
        CommandAlertSink(bad.sinks[0], Redactor()).send(_alert())  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
@pytest.mark.parametrize("key", ["password", "url"])
def test_a_secret_file_others_may_read_is_refused(tmp_path: Path, mode: int, key: str) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret-pass\n")
    secret.chmod(mode)
    with pytest.raises(SecretError) as exc:
        resolve_secret(key, None, secret, {})
    message = str(exc.value)
    assert f"{key}_file" in message and str(secret) in message and f"{mode:o}" in message
    assert f"chmod 600 {secret}" in message
    assert "s3cret" not in message
    secret.chmod(0o400)  # owner-only, read-only: fine
    assert resolve_secret(key, None, secret, {}) == "s3cret-pass"


@pytest.mark.parametrize(
    ("host", "refused"),
    [
        ("smtp.example.org", True),
        ("10.0.0.7", True),
        ("127.0.0.1", False),
        ("localhost", False),
        ("::1", False),
    ],
)
def test_a_password_is_never_sent_to_a_remote_relay_without_tls(host: str, refused: bool) -> None:
    # smtplib's login over `security: none` sends the password base64-encoded: in clear on the wire.
    sink = {"type": "email", "host": host, "security": "none", "username": "bot", "password_env": "PW",
            "sender": "a@b.c", "to": ["d@e.f"]}  # fmt: skip
    if not refused:
        AlertsConfig.model_validate({"sinks": [sink]})
        return
    with pytest.raises(ValidationError) as err:
        AlertsConfig.model_validate({"sinks": [sink]})
    assert "sends the password" in str(err.value) and "starttls" in str(err.value)
    # Without a password, or with TLS, the same relay is fine.
    AlertsConfig.model_validate({"sinks": [{**sink, "password_env": None, "username": None}]})
    AlertsConfig.model_validate({"sinks": [{**sink, "security": "starttls"}]})

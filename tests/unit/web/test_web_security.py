"""Security checks: bind policy, tokens, Host header, run ids, config, control requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from steadytune.rundir import RunDir
from steadytune.telemetry.events import read_events
from steadytune.web import control
from steadytune.web.config import DashboardConfig
from steadytune.web.runs import RunsIndex
from steadytune.web.security import (
    BindRefused,
    bearer,
    check_bind,
    host_allowed,
    is_loopback,
    resolve_token,
    token_ok,
)

TOKEN = "0123456789abcdef-token"


def test_loopback_detection() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.5.5.5", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.2", "example.com", ""))


def test_non_loopback_bind_needs_a_token_and_says_why() -> None:
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", TOKEN)
    with pytest.raises(BindRefused, match=r"refusing to serve the dashboard on 0\.0\.0\.0.*STEADYTUNE_DASHBOARD_TOKEN"):
        check_bind("0.0.0.0", None)
    with pytest.raises(BindRefused, match="at least 16"):
        check_bind("127.0.0.1", "short")


def test_token_sources_and_comparison(tmp_path: Path) -> None:
    assert resolve_token("cli", environ={"STEADYTUNE_DASHBOARD_TOKEN": "env"}) == "cli"
    assert resolve_token(None, environ={"STEADYTUNE_DASHBOARD_TOKEN": "env"}) == "env"
    f = tmp_path / "tok"
    f.write_text("from-file\n")
    assert resolve_token(None, token_env=None, token_file=f, environ={}) == "from-file"
    assert resolve_token(None, environ={}) is None
    assert token_ok(TOKEN, TOKEN) and not token_ok(TOKEN, TOKEN + "x") and not token_ok(None, None)
    assert not token_ok(None, "anything")  # no token configured: nobody may act


def test_token_only_from_headers_never_cookies() -> None:
    assert bearer({"X-Steadytune-Token": " t "}) == "t"
    assert bearer({"Authorization": "Bearer abc"}) == "abc"
    assert bearer({"Cookie": f"token={TOKEN}"}) is None


def test_host_header_on_loopback_only_loopback_names() -> None:
    assert host_allowed("127.0.0.1:7860", "127.0.0.1", 7860)
    assert host_allowed("localhost:7860", "127.0.0.1", 7860)
    assert host_allowed("[::1]:7860", "::1", 7860)
    assert not host_allowed("evil.example:7860", "127.0.0.1", 7860)
    assert not host_allowed(None, "127.0.0.1", 7860)
    assert host_allowed("gpu-box:7860", "0.0.0.0", 7860)


def test_dashboard_config_rejects_clear_token() -> None:
    with pytest.raises(ValidationError, match="token_env: STEADYTUNE_DASHBOARD_TOKEN"):
        DashboardConfig.model_validate({"token": "hunter2hunter2hunter2"})
    with pytest.raises(ValidationError, match="Extra inputs"):
        DashboardConfig.model_validate({"hots": "0.0.0.0"})
    assert DashboardConfig().host == "127.0.0.1"


def test_run_ids_are_validated_before_any_path(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    RunDir(runs / "good").create()
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "status.json").write_text("{}")
    index = RunsIndex(runs, cache_dir=tmp_path / "cache")
    assert index.get("good") is not None
    for bad in ("../secret", "..", "../../etc", "/etc", "good/../../secret", "", ".hidden", "a" * 200):
        assert index.get(bad) is None, bad
    assert index.run_ids() == ["good"]


def test_control_fallback_writes_request_and_event(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control, "_supervisor_send", lambda: None)  # as before supervise.control existed
    run = RunDir(tmp_path / "r").create()
    result = control.send(run, "pause", "alice (dashboard, 127.0.0.1)", sender=None)
    req = json.loads(run.control.read_text())
    assert req["command"] == "pause" and req["issuer"] == "alice (dashboard, 127.0.0.1)" and req["id"] == result["id"]
    (event,) = read_events(run.events)
    assert event.kind == "control" and event.name == "pause" and event.data["issuer"].startswith("alice")
    with pytest.raises(control.ControlError, match="unknown command"):
        control.send(run, "rm -rf", "alice")
    with pytest.raises(control.ControlError, match="issuer name is required"):
        control.send(run, "stop", "<>;")


def test_control_prefers_the_supervisor_module(tmp_path: Path) -> None:
    """With no sender given, the request goes through steadytune.supervise.control, not the fallback."""
    from steadytune.supervise.control import send_control

    assert control._supervisor_send() is send_control
    run = RunDir(tmp_path / "r").create()
    result = control.send(run, "checkpoint", "bob (dashboard, 127.0.0.1)")
    req = json.loads(run.control.read_text())
    assert result["via"] == "supervisor" and result["id"] == req["id"] and len(req["id"]) == 32
    assert (req["command"], req["issuer"]) == ("checkpoint", "bob (dashboard, 127.0.0.1)")
    # The supervisor files the request itself when it picks it up (one writer per event log); the
    # fallback would have appended a dashboard event here.
    assert not run.events.exists() or read_events(run.events) == []


def test_a_sender_only_ever_sees_a_cleaned_issuer(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r").create()
    calls = []
    control.send(run, "stop", "<b>eve</b>;rm -rf /\n", sender=lambda *a: calls.append(a) or {"id": "x1"})
    assert calls == [(run, "stop", "bevebrm -rf", None)]  # no markup, no ';', '/' or newline reaches it


def test_control_through_the_real_supervisor_module(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r").create()
    result = control.send(run, "stop", "carol (dashboard, 127.0.0.1)")
    req = json.loads(run.control.read_text())
    assert (req["command"], req["issuer"], req["id"]) == ("stop", "carol (dashboard, 127.0.0.1)", result["id"])

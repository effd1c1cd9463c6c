"""Security checks: bind policy, tokens, Host header, run ids, config, control requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from steadytune.config.dashboard import DashboardConfig
from steadytune.protocol import ControlError, operator_issuer, send_control
from steadytune.rundir import RunDir
from steadytune.telemetry.events import read_events
from steadytune.web.params import BadParam, content_length, query_float, query_int
from steadytune.web.runs import RunsIndex
from steadytune.web.security import (
    BindRefused,
    bearer,
    check_bind,
    host_allowed,
    is_loopback,
    reads_need_token,
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
    with pytest.raises(
        BindRefused, match=r"refusing to serve the dashboard on 0\.0\.0\.0.*STEADYTUNE_DASHBOARD_TOKEN"
    ):
        check_bind("0.0.0.0", None)
    with pytest.raises(BindRefused, match="at least 16"):
        check_bind("127.0.0.1", "short")


def test_token_sources_and_comparison(tmp_path: Path) -> None:
    assert resolve_token("cli", environ={"STEADYTUNE_DASHBOARD_TOKEN": "env"}) == "cli"
    assert resolve_token(None, environ={"STEADYTUNE_DASHBOARD_TOKEN": "env"}) == "env"
    f = tmp_path / "tok"
    f.write_text("from-file\n")
    f.chmod(0o600)
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
    assert host_allowed("localhost:9000", "127.0.0.1", 7860)  # an SSH tunnel on another local port
    assert not host_allowed("gpu-box:7860", "127.0.0.1", 7860, machine_names=("gpu-box",))


def test_host_header_off_loopback_our_names_addresses_or_public_url() -> None:
    names = ("gpu-box", "gpu-box.lab.example")
    assert host_allowed("gpu-box:7860", "0.0.0.0", 7860, machine_names=names)
    assert host_allowed("GPU-BOX.lab.example.:7860", "0.0.0.0", 7860, machine_names=names)
    assert host_allowed("10.0.0.7:7860", "0.0.0.0", 7860)  # an address, not a name: nothing to rebind
    assert host_allowed("[fe80::1]:7860", "::", 7860)
    assert host_allowed("localhost:7860", "0.0.0.0", 7860)
    assert host_allowed("box.lab.example", "box.lab.example", 7860)  # bound by name
    assert not host_allowed("gpu-box:7860", "0.0.0.0", 7860)  # not one of this machine's names
    assert not host_allowed("evil.example:7860", "0.0.0.0", 7860, machine_names=names)
    assert not host_allowed("gpu-box.evil.example", "0.0.0.0", 7860, machine_names=names)
    public = "https://dash.example/"
    assert host_allowed("dash.example", "127.0.0.1", 7860, public_url=public)  # behind a proxy on loopback
    assert host_allowed("dash.example:443", "0.0.0.0", 7860, public_url=public)
    assert not host_allowed("evil.example", "127.0.0.1", 7860, public_url=public)
    for bad in (
        "",
        "a b",
        "x@gpu-box",
        "gpu-box:80:80",
        "[::1",
        "gpu-box:http",
        "gpu-box/x",
        "gpu-box:99999",
    ):
        assert not host_allowed(bad, "0.0.0.0", 7860, machine_names=names), bad


def test_reads_need_the_token_when_reachable_from_other_machines() -> None:
    assert not reads_need_token("127.0.0.1") and not reads_need_token("::1")
    assert reads_need_token("0.0.0.0") and reads_need_token("10.0.0.2") and reads_need_token("::")
    assert reads_need_token("127.0.0.1", public_url="https://dash.example/")  # behind a proxy
    check_bind("127.0.0.1", TOKEN, public_url="https://dash.example/")
    with pytest.raises(BindRefused, match="public_url"):
        check_bind("127.0.0.1", None, public_url="https://dash.example/")
    with pytest.raises(BindRefused, match="no token is set"):
        check_bind("127.0.0.1", None, exposed=True)


@pytest.mark.parametrize(
    ("q", "message"),
    [({"points": ["inf"]}, "points"), ({"points": ["nan"]}, "points"), ({"points": ["1e400"]}, "points"),
     ({"points": ["abc"]}, "points"), ({"points": ["12.5"]}, "points"), ({"points": [str(2**70)]}, "points"),
     ({"points": [""]}, "points")],
)  # fmt: skip
def test_query_int_rejects_what_is_not_an_integer(q: dict, message: str) -> None:
    with pytest.raises(BadParam, match=message) as info:
        query_int(q, "points", 1500)
    assert info.value.param == "points"


def test_query_numbers_parse_and_clamp() -> None:
    assert query_int({}, "points", 1500) == 1500
    assert query_int({"points": ["400"]}, "points", 1500) == 400
    assert query_int({"points": ["400.0"]}, "points", 1500) == 400
    assert query_int({"after": ["-1"]}, "after", -1) == -1
    assert query_int({"points": ["999999"]}, "points", 10, hi=4000) == 4000
    assert query_float({}, "lo") is None and query_float({"lo": ["12.5"]}, "lo") == 12.5
    for bad in ("nan", "inf", "-inf", "x", "1e400"):
        with pytest.raises(BadParam, match="lo"):
            query_float({"lo": [bad]}, "lo")
    assert content_length({"Content-Length": "12"}) == 12 and content_length({}) == 0
    for bad in ("abc", "-5", "1e3", "", " 1 2", "9" * 30):
        with pytest.raises(BadParam, match="Content-Length"):
            content_length({"Content-Length": bad})


def test_dashboard_config_limits_and_public_url() -> None:
    cfg = DashboardConfig()
    assert (cfg.request_timeout_s, cfg.max_connections, cfg.max_streams, cfg.public_url) == (
        10.0,
        64,
        16,
        None,
    )
    assert DashboardConfig(public_url="https://dash.example/").public_url == "https://dash.example/"
    assert DashboardConfig(public_url="http://dash.example:8080").public_url == "http://dash.example:8080"
    for bad in (
        "dash.example",
        "ftp://dash.example/",
        "https:///x",
        "javascript:alert(1)",
        "https://dash.example/st/",
    ):
        with pytest.raises(ValidationError, match="public_url"):
            DashboardConfig(public_url=bad)
    with pytest.raises(ValidationError, match="max_streams"):
        DashboardConfig(max_connections=8, max_streams=8)
    with pytest.raises(ValidationError):
        DashboardConfig(request_timeout_s=0)


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


def test_a_dashboard_request_is_queued_with_the_cleaned_issuer_and_no_event(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r").create()
    issuer = operator_issuer("<b>eve</b>;rm -rf /\n", "dashboard, 127.0.0.1")
    assert issuer == "bevebrm -rf (dashboard, 127.0.0.1)"  # no markup, no ';', '/' or newline reaches the log
    sent = send_control(run, "stop", issuer)
    (only,) = run.control.iterdir()
    req = json.loads(only.read_text())
    assert (req["command"], req["issuer"], req["id"]) == ("stop", issuer, sent["id"])
    # The supervisor files the request itself when it reads the queue: one writer per event log.
    assert not run.events.exists() or read_events(run.events) == []
    with pytest.raises(ControlError, match="unknown control command 'rm -rf'"):
        send_control(run, "rm -rf", issuer)
    with pytest.raises(ControlError, match="issuer name is required"):
        operator_issuer("<>;", "dashboard, 127.0.0.1")


def test_a_long_issuer_cannot_push_the_client_address_out() -> None:
    issuer = operator_issuer("a" * 500, "dashboard, 10.0.0.7")
    assert issuer == "a" * 64 + " (dashboard, 10.0.0.7)"


@pytest.mark.parametrize("name", ["policy:loss_spike", "POLICY: x", "signal SIGTERM", " signalman"])
def test_the_supervisors_issuers_cannot_be_claimed(name: str) -> None:
    with pytest.raises(ControlError, match="are the supervisor's own; give your own name"):
        operator_issuer(name, "dashboard, 127.0.0.1")


def test_a_token_file_others_may_read_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "tok"
    f.write_text(TOKEN + "\n")
    f.chmod(0o644)
    with pytest.raises(BindRefused) as exc:
        resolve_token(None, token_env=None, token_file=f, environ={})
    assert str(f) in str(exc.value) and "644" in str(exc.value) and f"chmod 600 {f}" in str(exc.value)
    assert TOKEN not in str(exc.value)


def test_an_issuer_cannot_forge_the_front_end_and_address() -> None:
    """A typed "(dashboard, 10.0.0.7)" read like the suffix steadytune adds, from another client."""
    issuer = operator_issuer("alice (dashboard, 10.0.0.7)", "dashboard, 127.0.0.1")
    assert issuer.count("(") == 1 and issuer.endswith(" (dashboard, 127.0.0.1)"), issuer


@pytest.mark.parametrize("raw", ["0\x1f", "\x0c5", "5\x0b", "1 2", "+5", "٥"])
def test_a_content_length_with_other_blanks_or_digits_is_a_bad_param(raw: str) -> None:
    """Found by the fuzzing harness: "0\\x1f" passed the check (str.strip) and then int() raised."""
    from email.message import Message

    headers = Message()
    headers["Content-Length"] = raw
    with pytest.raises(BadParam, match="not a byte count"):
        content_length(headers)

"""``steadytune alert test CONFIG`` on the files people give it: a run config, an alerts-only YAML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.cli.main import main

REPO = Path(__file__).resolve().parents[3]


def test_a_run_config_without_alerts_tests_the_default_console_sink(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["alert", "test", str(REPO / "examples" / "lora.yaml")]) == 0
    out = capsys.readouterr()
    assert "1 of 1 sink(s) delivered the test alert" in out.out
    assert "[steadytune" in out.err  # the console sink wrote the alert itself


def test_the_alerts_section_of_a_run_config_is_the_one_tested(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "my.yaml"
    config.write_text(
        (REPO / "examples" / "lora.yaml").read_text()
        + "alerts:\n  sinks:\n    - {type: jsonl, path: "
        + str(tmp_path / "alerts.jsonl")
        + "}\n"
    )
    assert main(["alert", "test", str(config)]) == 0
    assert "1 of 1 sink(s) delivered" in capsys.readouterr().out
    (line,) = (tmp_path / "alerts.jsonl").read_text().splitlines()
    assert json.loads(line)["run_id"] == "alert-test"


def test_an_alerts_only_yaml_is_read_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "alerts.yaml"
    config.write_text(
        "min_severity: critical\nsinks: [{type: jsonl, path: " + str(tmp_path / "a.jsonl") + "}]\n"
    )
    assert main(["alert", "test", str(config)]) == 0
    assert (tmp_path / "a.jsonl").exists()


def test_a_file_that_is_not_yaml_is_named_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "my.yaml"
    config.write_text("preparing the demo model...\nmodel:\n  name: x\n")
    assert main(["alert", "test", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{config} is not valid YAML" in err and "Traceback" not in err


def test_sinks_of_one_type_are_each_told_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Two jsonl sinks, the second one's path a folder: one delivers, one fails, and each says so
    # under its own label (they used to share the label `jsonl`, the second's result shown twice).
    good, bad = tmp_path / "a.jsonl", tmp_path / "folder"
    bad.mkdir()
    config = tmp_path / "alerts.yaml"
    config.write_text(f"sinks: [{{type: jsonl, path: {good}}}, {{type: jsonl, path: {bad}}}]\n")
    assert main(["alert", "test", str(config)]) == 1
    out = capsys.readouterr().out
    lines = [line.strip() for line in out.splitlines()]
    assert any(line.startswith("ok") and "jsonl#0:" in line for line in lines), out
    assert any(line.startswith("FAIL") and "jsonl#1:" in line and str(bad) in line for line in lines), out
    assert "1 of 2 sink(s) delivered the test alert" in out
    assert good.exists()


def _secret_trouble(tmp_path: Path) -> str:
    """An alerts section with two secrets that cannot be read: an unset variable, an open file."""
    loose = tmp_path / "smtp-password"
    loose.write_text("hunter2\n")
    loose.chmod(0o644)
    return (
        "alerts:\n  sinks:\n    - {type: console}\n"
        "    - {type: webhook, url_env: STEADYTUNE_TEST_UNSET_HOOK}\n"
        "    - {type: email, host: 127.0.0.1, username: bot, password_file: "
        f"{loose}, sender: a@b.c, to: [d@e.f]}}\n"
    )


def test_alert_test_names_every_unreadable_secret_by_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STEADYTUNE_TEST_UNSET_HOOK", raising=False)
    config = tmp_path / "alerts.yaml"
    config.write_text(_secret_trouble(tmp_path))
    assert main(["alert", "test", str(config)]) == 2
    err = capsys.readouterr().err
    assert "alerts.sinks.1.url_env: environment variable STEADYTUNE_TEST_UNSET_HOOK is not set" in err
    assert "alerts.sinks.2.password_file:" in err and "chmod 600" in err
    assert "hunter2" not in err


def test_a_run_whose_alert_secrets_cannot_be_read_stops_before_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The supervisor's router used to raise it: a traceback, and a run folder with no status.
    monkeypatch.delenv("STEADYTUNE_TEST_UNSET_HOOK", raising=False)
    config = tmp_path / "my.yaml"
    config.write_text((REPO / "examples" / "lora.yaml").read_text() + _secret_trouble(tmp_path))
    runs = tmp_path / "runs"
    code = main(["run", str(config), f"run.runs_dir={runs}", "--skip-check", "--quiet"])
    out = capsys.readouterr()
    assert code == 2
    assert "alerts.sinks.1.url_env" in out.out and "alerts.sinks.2.password_file" in out.out
    assert "Traceback" not in out.out + out.err
    assert not runs.exists() or not any(runs.iterdir())

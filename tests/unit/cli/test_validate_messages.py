"""``validate``'s words: the overrides are optional in its usage error, and its OK line names its unit."""

from __future__ import annotations

from pathlib import Path

import pytest

from steadytune.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "lora.yaml"


@pytest.mark.parametrize("command", ["validate", "run", "check"])
def test_without_arguments_only_the_config_is_required(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main([command])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "required: config" in err and "key=value" not in err.split("required:")[1]


def test_the_ok_line_says_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "hi"}\n')
    overrides = ["train.max_steps=200", f"data.train_file={data}", "data.eval_file=null",
                 "model.name_or_path=sshleifer/tiny-gpt2"]  # fmt: skip
    assert main(["validate", str(EXAMPLE), *overrides]) == 0
    assert capsys.readouterr().out.rstrip().endswith(", 200 steps")


@pytest.mark.parametrize("command", ["validate", "check", "run"])
def test_a_config_error_exits_2_whichever_command_reads_it(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text())
    assert main([command, str(bad), "train.learning_rate=abc"]) == 2
    assert "train.learning_rate" in capsys.readouterr().err


def test_a_misspelled_sink_is_shown_without_its_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A sink whose type is wrong or missing was printed whole: its webhook URL and password too.
    hook, password = "https://chat.example.org/hooks/T0/Zq8sLk2VbX9", "pw-Zq8sLk2VbX9"
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        EXAMPLE.read_text()
        + "alerts:\n  min_severity: loud\n  sinks:\n"
        + f"    - {{type: webhok, url: '{hook}'}}\n"
        + f"    - {{type: emial, host: h, password: '{password}', to: [a@b.c]}}\n"
        + f"    - {{url: '{hook}'}}\n"
        + f"    - '{hook}'\n"
    )
    assert main(["validate", str(bad)]) == 2
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Zq8sLk2VbX9" not in text
    for i in range(4):
        assert f"alerts.sinks.{i}:" in text
    assert "https://chat.example.org/***" in text  # the host stays: which service it was
    assert "add 'type': one of console, jsonl, webhook, email, command" in text
    assert "alerts.min_severity" in text and "Fix: use 'info', 'warning' or 'critical'" in text

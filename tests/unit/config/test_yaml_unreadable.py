"""A YAML file that parses but cannot be read (an integer past Python's digit limit, bytes that are
not UTF-8, a date that is no date) is the one bounded loader's error, naming the file and the key,
never a traceback from the readers behind it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from steadytune.cli.main import main
from steadytune.config.yamlsafe import YamlUnreadable, load_yaml
from steadytune.forensics.runview import ForensicsError, load_run_config
from steadytune.rundir import RunDir

DIGITS = sys.get_int_max_str_digits() + 700
HUGE = b"train:\n  max_steps: " + b"9" * DIGITS + b"\n"
NOT_UTF8 = b"model:\n  name_or_path: caf\xe9\n"


def test_an_integer_past_the_digit_limit_names_its_key_line_and_fix() -> None:
    with pytest.raises(YamlUnreadable) as caught:
        load_yaml(HUGE)
    e = caught.value
    assert isinstance(e, yaml.YAMLError)  # every caller's except yaml.YAMLError catches it
    assert e.key == "train.max_steps" and e.problem_mark is not None and e.problem_mark.line == 1
    assert f"{DIGITS:,} digits" in e.problem and "quote it" in e.fix


def test_bytes_that_are_not_utf8_are_placed_at_their_line() -> None:
    with pytest.raises(YamlUnreadable) as caught:
        load_yaml(NOT_UTF8)
    e = caught.value
    assert "0xe9" in e.problem and e.problem_mark is not None
    assert (e.problem_mark.line, e.problem_mark.column) == (1, 19)


def test_a_value_its_type_refuses_names_its_key() -> None:
    with pytest.raises(YamlUnreadable) as caught:
        load_yaml("run:\n  started: 2024-13-45\n")
    assert caught.value.key == "run.started" and caught.value.value == "2024-13-45"


@pytest.mark.parametrize(
    ("content", "said"),
    [(HUGE, ["train.max_steps", f"{DIGITS:,} digits", "line 2"]), (NOT_UTF8, ["not UTF-8", "line 2"])],
    ids=["huge-int", "not-utf8"],
)
def test_validate_names_the_file_and_the_problem(
    tmp_path: Path, content: bytes, said: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_bytes(content)
    assert main(["validate", str(path)]) == 2
    out = capsys.readouterr()
    text = out.out + out.err
    assert str(path) in text and "Traceback" not in text
    assert all(part in text for part in said), text


@pytest.mark.parametrize("content", [HUGE, NOT_UTF8], ids=["huge-int", "not-utf8"])
def test_a_run_folders_config_is_a_clear_error(tmp_path: Path, content: bytes) -> None:
    run = RunDir(tmp_path / "run-1")
    run.root.mkdir()
    run.config.write_bytes(content)
    with pytest.raises(ForensicsError) as caught:
        load_run_config(run)
    assert str(run.config) in str(caught.value)


@pytest.mark.parametrize("content", [HUGE, NOT_UTF8], ids=["huge-int", "not-utf8"])
def test_audit_verify_reads_such_a_config_as_no_secret_rather_than_failing(content: bytes) -> None:
    from steadytune.cli.audit import unredacted_secrets

    assert unredacted_secrets(content) == []  # the file as audit verify reads it: bytes

"""The dataset scan up to the tokenizer (no torch): file, UTF-8, format and content checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.preflight.datascan import count, scan_data

from .conftest import DEMO, make_config


def never(*_: object) -> object:
    raise AssertionError("the tokenizer must not be loaded")


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def names(scan) -> dict[str, str]:
    return {c.name: c.status for c in scan.checks}


def test_a_model_folder_without_tokenizer_files_skips_token_checks_without_loading(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    write(tmp_path / "train.jsonl", [{"text": "hello"}, {"text": "world"}])
    scan = scan_data(make_config(tmp_path), DEMO, tokenizer_loader=never)
    assert names(scan) == {"utf8": "ok", "format": "ok", "empty": "ok", "duplicates": "ok", "tokenizer": "na"}
    assert scan.samples == 2


def test_missing_file_unknown_columns_and_empty_files_fail(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    assert names(scan_data(cfg, DEMO, None)) == {"data_file": "fail"}
    write(tmp_path / "train.jsonl", [{"prompt": "no known column"}])
    scan = scan_data(cfg, DEMO, None)
    assert names(scan)["format"] == "fail" and "cannot tell the data format" in scan.checks[-1].reason
    (tmp_path / "train.jsonl").write_text("\n\n")
    assert names(scan_data(cfg, DEMO, None))["format"] == "fail"


def test_eval_file_problems_are_reported_with_a_prefix(tmp_path: Path) -> None:
    write(tmp_path / "train.jsonl", [{"text": "a"}])
    (tmp_path / "eval.jsonl").write_bytes(b'{"text": "\xe9"}\n')
    scan = scan_data(make_config(tmp_path, data={"eval_file": str(tmp_path / "eval.jsonl")}), DEMO, None)
    assert names(scan)["eval_utf8"] == "fail"


def test_max_samples_limits_the_scan_to_what_trains(tmp_path: Path) -> None:
    write(tmp_path / "train.jsonl", [{"text": "a"}, {"text": "b"}, {"text": ""}])
    scan = scan_data(make_config(tmp_path, data={"max_samples": 2}), DEMO, None)
    assert scan.samples == 2 and names(scan)["empty"] == "ok"


@pytest.mark.parametrize(
    "n, noun, text",
    [
        (1, "empty sample", "1 empty sample"),
        (3, "empty sample", "3 empty samples"),
        (2, "sample with an empty answer", "2 samples with an empty answer"),
    ],
)
def test_count(n: int, noun: str, text: str) -> None:
    assert count(n, noun) == text

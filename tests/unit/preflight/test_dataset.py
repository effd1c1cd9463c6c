"""Dataset defects from raw bytes, rows and tokenized samples, with exact line numbers."""

from __future__ import annotations

import json
from pathlib import Path

from steadytune.data.encode import IGNORE_INDEX
from steadytune.preflight.dataset import content_findings, scan_raw, show_lines, token_stats


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def row(**kw: str) -> bytes:
    return json.dumps({"instruction": "Say hi.", "input": "", "output": "hi", **kw}).encode()


def test_invalid_utf8_is_found_on_every_line_with_its_byte_offset(tmp_path: Path) -> None:
    lines = [row(), b'{"instruction": "caf\xe9", "input": "", "output": "x"}', row(), b'{"text": "\xff\xfe"}']
    path = write_lines(tmp_path / "d.jsonl", lines)
    scan = scan_raw(path)
    first_bad = len(lines[0]) + 1 + lines[1].index(b"\xe9")
    assert scan.invalid_utf8[0] == (2, first_bad)
    assert [ln for ln, _ in scan.invalid_utf8] == [2, 4]
    assert scan.lines == [1, 2, 3, 4]  # the rows are still read (with replacement characters)
    assert scan.rows[1]["instruction"] == "caf\ufffd"


def test_blank_lines_bad_json_and_non_objects(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "d.jsonl", [row(), b"", b"   ", b"{not json", b"[1, 2]", row()])
    scan = scan_raw(path)
    assert scan.blank_lines == 2 and scan.lines == [1, 6]
    assert [n for n, _ in scan.bad_json] == [4, 5]


def test_json_file_invalid_utf8_reports_its_line(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_bytes(b'[\n{"text": "ok"},\n{"text": "\xe9"}\n]')
    scan = scan_raw(path)
    assert [ln for ln, _ in scan.invalid_utf8] == [3] and len(scan.rows) == 2


def test_content_findings_per_format() -> None:
    rows = [
        {"instruction": "Add.", "input": "1+1", "output": "2"},
        {"instruction": "", "input": "", "output": ""},
        {"instruction": "  ", "input": "\t", "output": " "},
        {"instruction": "Add.", "input": "1+1", "output": "2"},
        {"instruction": "Say nothing.", "input": "", "output": "  "},
    ]
    found = content_findings(rows, [10, 11, 12, 13, 14], "instruction")
    assert found["empty"] == [11] and found["whitespace"] == [12] and found["empty_answer"] == [14]
    assert found["duplicate"] == [13] and found["duplicate_of"] == [10]
    chats = [
        {"messages": [{"role": "user", "content": "hi"}]},
        {"messages": [{"role": "user", "content": ""}]},
    ]
    found = content_findings(chats, [1, 2], "messages")
    assert found["empty_answer"] == [1] and found["empty"] == [2]
    texts = [{"text": "a"}, {"text": ""}, {"text": " \n"}]
    assert content_findings(texts, [1, 2, 3], "text")["whitespace"] == [3]


def test_token_stats_truncation_masking_and_vocabulary() -> None:
    m = IGNORE_INDEX
    encoded = [
        {"input_ids": [1, 5, 6, 2], "labels": [m, m, 6, 2]},  # fine
        {"input_ids": [1, 5, 6, 7, 8, 9], "labels": [m, m, m, m, m, m]},  # prompt fills the window
        {"input_ids": [1, 5, 2], "labels": [1, m, m]},  # only position 0: shifted away, no loss
        {"input_ids": [1, 600, 2], "labels": [m, 600, 2]},  # id beyond a 512 vocabulary
        {"input_ids": [1, 5, 6, 7, 8, 9], "labels": [m, 5, 6, 7, 8, 9]},  # exactly fits (untruncated 6)
    ]
    true = {1: 40, 4: 6}
    stats = token_stats(
        encoded, [1, 2, 3, 4, 5], max_seq_length=6, vocab_size=512, true_length=true.__getitem__
    )
    assert stats.truncated == ((2, 40),)
    assert stats.all_masked == (2, 3)
    assert stats.over_vocab == ((4, 600),)
    assert stats.longest == 6 and stats.longest_untruncated == 40
    assert stats.total_tokens == 4 + 6 + 3 + 3 + 6


def test_show_lines() -> None:
    assert show_lines([3]) == "line 3"
    assert show_lines(list(range(1, 9))) == "lines 1, 2, 3, 4, 5 (+3 more)"

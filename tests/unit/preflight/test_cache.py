"""The tokenized-data cache: durations, what clean removes (oldest first), listing with meta.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from steadytune.preflight.cache import CacheEntry, list_entries, parse_duration, remove, select_for_removal

DAY = 86400.0
NOW = 1_000_000.0


def entry(key: str, size: int, last_used_days_ago: float, partial: bool = False) -> CacheEntry:
    t = NOW - last_used_days_ago * DAY
    return CacheEntry(key, Path("/x") / key, size, t, t, partial=partial)


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30s", 30),
        ("15m", 900),
        ("12h", 43200),
        ("7d", 604800),
        ("2w", 1209600),
        ("1.5h", 5400),
        (" 3D ", 259200),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["7", "d", "7 days", "-1d", ""])
def test_parse_duration_rejects_with_the_fix(bad: str) -> None:
    with pytest.raises(ValueError, match="7d or 12h"):
        parse_duration(bad)


def test_older_than_removes_entries_unused_for_longer() -> None:
    entries = [entry("a", 10, 40), entry("b", 10, 10), entry("c", 10, 1)]
    assert [e.key for e in select_for_removal(entries, NOW, older_than=7 * DAY)] == ["a", "b"]


def test_max_size_removes_least_recently_used_until_under() -> None:
    entries = [entry("new", 50, 1), entry("old", 30, 9), entry("mid", 40, 5)]
    assert [e.key for e in select_for_removal(entries, NOW, max_size=60)] == ["old", "mid"]
    assert [e.key for e in select_for_removal(entries, NOW, max_size=120)] == []
    assert [e.key for e in select_for_removal(entries, NOW, max_size=0)] == ["old", "mid", "new"]


def test_both_limits_and_partial_builds() -> None:
    entries = [
        entry("ancient", 5, 100),
        entry("big", 100, 2),
        entry("small", 10, 1),
        entry("crashed", 7, 1, partial=True),
        entry("building", 7, 0.0001, partial=True),
    ]
    doomed = select_for_removal(entries, NOW, max_size=20, older_than=30 * DAY)
    # "building" (younger than an hour) may still be writing; it is kept and not counted against max_size.
    assert [e.key for e in doomed] == ["ancient", "crashed", "big"]


def test_list_and_remove_real_folders(tmp_path: Path) -> None:
    old, new = tmp_path / "aaa", tmp_path / "bbb"
    for folder, meta_age in ((old, 3 * DAY), (new, 60)):
        folder.mkdir()
        (folder / "data-00000-of-00001.arrow").write_bytes(b"x" * 1000)
        (folder / "meta.json").write_text(
            json.dumps(
                {
                    "source": f"/data/{folder.name}.jsonl",
                    "samples": 5,
                    "created": NOW - meta_age,
                    "max_seq_length": 64,
                }
            )
        )
        t = os.path.getmtime(folder / "meta.json") - meta_age
        os.utime(folder / "meta.json", (t, t))
    (tmp_path / ".ccc.123.tmp").mkdir()
    entries = list_entries(tmp_path)
    assert [e.key for e in entries if not e.partial] == ["aaa", "bbb"]  # least recently used first
    a = entries[0]
    assert a.source == "/data/aaa.jsonl" and a.samples == 5 and a.size_bytes > 1000
    assert [e.key for e in entries if e.partial] == ["ccc"]
    freed = remove([a])
    assert freed == a.size_bytes and not old.exists() and new.exists()
    assert list_entries(tmp_path / "missing") == []

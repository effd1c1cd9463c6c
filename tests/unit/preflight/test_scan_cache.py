"""The dataset scan's stored answer: reused while its inputs stay, replaced when one changes."""

from __future__ import annotations

import os
from pathlib import Path

from steadytune.preflight.datascan import DataScan
from steadytune.preflight.result import ok, warn
from steadytune.preflight.scancache import cached_scan, scan_key


def setup(tmp_path: Path) -> tuple[dict, dict]:
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w" * 10)
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "a"}\n')
    return {"train_file": str(data), "max_seq_length": 128}, {"name_or_path": str(model)}


def test_the_key_follows_the_data_the_tokenizer_files_and_the_settings_but_not_the_weights(
    tmp_path: Path,
) -> None:
    data, model = setup(tmp_path)
    first = scan_key(data, model)
    assert first is not None and scan_key(data, model) == first
    weights = Path(model["name_or_path"]) / "model.safetensors"
    weights.write_bytes(b"v" * 99)  # new weights: the tokens, lengths and labels are the same
    assert scan_key(data, model) == first
    assert scan_key({**data, "max_seq_length": 64}, model) != first
    tok = Path(model["name_or_path"]) / "tokenizer.json"
    tok.write_text('{"added": 1}')
    assert scan_key(data, model) != first
    after_tok = scan_key(data, model)
    path = Path(data["train_file"])
    st = path.stat()
    path.write_text('{"text": "b"}\n')  # same size: the modification time tells
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert scan_key(data, model) not in (first, after_tok)


def test_a_hub_model_name_is_never_cached(tmp_path: Path) -> None:
    data, _ = setup(tmp_path)
    assert scan_key(data, {"name_or_path": "meta-llama/Llama-3.2-1B"}) is None
    calls: list[int] = []
    cached_scan(None, tmp_path / "scans", lambda: calls.append(1) or DataScan())
    cached_scan(None, tmp_path / "scans", lambda: calls.append(1) or DataScan())
    assert calls == [1, 1] and not (tmp_path / "scans").exists()


def test_a_stored_scan_comes_back_equal_without_scanning(tmp_path: Path) -> None:
    answer = DataScan(
        checks=[ok("data", "format", "instruction format, 3 samples"),
                warn("data", "duplicates", "1 duplicate", "dedupe", count=1, lines=[2, 3])],
        samples=3, total_tokens=40, longest=17, cache_need_bytes=0,
    )  # fmt: skip
    calls: list[int] = []

    def scan() -> DataScan:
        calls.append(1)
        return answer

    got, stored = cached_scan("k1", tmp_path / "scans", scan)
    assert (got, stored, calls) == (answer, False, [1])
    again, stored = cached_scan("k1", tmp_path / "scans", scan)
    assert (again, stored, calls) == (answer, True, [1])
    (tmp_path / "scans" / "k1.json").write_text("{not json")  # a torn file is scanned again
    assert cached_scan("k1", tmp_path / "scans", scan) == (answer, False)
    assert calls == [1, 1]

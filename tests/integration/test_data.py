"""Data formats, label masking, ids/hashes and the tokenized-data cache, with the real tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.data.encode import IGNORE_INDEX, DataSpec
from steadytune.data.rows import DataError, load_rows
from steadytune.train.data import SAMPLE_HASH, SAMPLE_ID, build_dataset


@pytest.fixture(scope="module")
def tok(demo_assets: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_assets / "model")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_instruction_masks_the_prompt(tok, tmp_path: Path) -> None:
    p = write_jsonl(
        tmp_path / "i.jsonl", [{"instruction": "Add the numbers.", "input": "1 + 2", "output": "3"}]
    )
    ds = build_dataset(tok, DataSpec(str(p)), cache=False)
    row = ds[0]
    trained = [t for t, lab in zip(row["input_ids"], row["labels"], strict=False) if lab != IGNORE_INDEX]
    assert tok.decode(trained).strip() == "3" + tok.eos_token
    assert row[SAMPLE_ID] == 0 and row[SAMPLE_HASH] > 0


def test_messages_train_only_on_assistant_turns(tok, tmp_path: Path) -> None:
    msgs = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi there"}]
    p = write_jsonl(tmp_path / "m.jsonl", [{"messages": msgs}])
    row = build_dataset(tok, DataSpec(str(p)), cache=False)[0]
    trained = tok.decode(
        [t for t, lab in zip(row["input_ids"], row["labels"], strict=False) if lab != IGNORE_INDEX]
    )
    assert "hi there" in trained and "Say hi" not in trained


def test_text_csv_and_parquet(tok, tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_list([{"text": "hello world"}, {"text": "green light"}]).to_parquet(
        str(tmp_path / "t.parquet")
    )
    (tmp_path / "t.csv").write_text("text\nhello world\ngreen light\n")
    for name in ("t.parquet", "t.csv"):
        ds = build_dataset(tok, DataSpec(str(tmp_path / name)), cache=False)
        assert len(ds) == 2 and ds[0]["labels"] == ds[0]["input_ids"]


def test_truncation_and_max_samples(tok, tmp_path: Path) -> None:
    p = write_jsonl(tmp_path / "t.jsonl", [{"text": "word " * 200}] * 5)
    ds = build_dataset(tok, DataSpec(str(p), max_seq_length=16, max_samples=3), cache=False)
    assert len(ds) == 3 and all(len(r["input_ids"]) == 16 for r in ds)


def test_unknown_columns_and_bad_json_are_explained(tok, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot tell the data format"):
        build_dataset(tok, DataSpec(str(write_jsonl(tmp_path / "x.jsonl", [{"foo": 1}]))), cache=False)
    (tmp_path / "broken.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(DataError, match=r"broken\.jsonl:2"):
        load_rows(tmp_path / "broken.jsonl")


def test_cache_is_reused_and_invalidated_by_content(
    tok, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEADYTUNE_DATA_CACHE", str(tmp_path / "cache"))
    p = write_jsonl(tmp_path / "c.jsonl", [{"text": "alpha"}])
    build_dataset(tok, DataSpec(str(p)))
    entries = list((tmp_path / "cache").iterdir())
    assert len(entries) == 1
    build_dataset(tok, DataSpec(str(p)))
    assert list((tmp_path / "cache").iterdir()) == entries  # same key: reused
    write_jsonl(p, [{"text": "beta"}])
    ds = build_dataset(tok, DataSpec(str(p)))
    assert (
        len(list((tmp_path / "cache").iterdir())) == 2 and tok.decode(ds[0]["input_ids"]).count("beta") == 1
    )

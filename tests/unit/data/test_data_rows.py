"""steadytune.data.rows: every format gives the same rows, so the same tokens and the same hashes."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from steadytune.data.encode import DataSpec, encode_row, sample_hash
from steadytune.data.rows import DataError, load_rows
from tests.fresh import REPO

ROWS = [
    {"instruction": "add 1.50 and 007", "input": "", "output": "8.5"},
    {"instruction": 'say "hi", twice', "input": "line one\nline two", "output": "hi, hi"},
]


def _write_csv(path: Path, rows: list[dict[str, str]], bom: bool = False) -> Path:
    with open(path, "w", encoding="utf-8-sig" if bom else "utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


class _CharTokenizer:
    """One id per character: enough to show two row readers give the same tokens."""

    bos_token_id = 1
    eos_token_id = 2

    def __call__(self, text: str, add_special_tokens: bool = False) -> object:
        return type("Enc", (), {"input_ids": [ord(c) for c in text]})()


def _hashes(rows: list[dict[str, object]]) -> list[int]:
    spec = DataSpec(path="", max_seq_length=256)
    return [sample_hash(encode_row(_CharTokenizer(), r, "instruction", spec)["input_ids"]) for r in rows]


def test_csv_cells_stay_text_as_written_and_an_empty_cell_is_none(tmp_path: Path) -> None:
    rows = load_rows(_write_csv(tmp_path / "d.csv", ROWS, bom=True))
    assert list(rows[0]) == ["instruction", "input", "output"]  # the byte-order mark is not in a name
    assert rows[0] == {"instruction": "add 1.50 and 007", "input": None, "output": "8.5"}
    assert rows[1]["input"] == "line one\nline two" and rows[1]["instruction"] == 'say "hi", twice'


def test_csv_parquet_and_jsonl_of_the_same_rows_hash_alike(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    got = {p.suffix: _hashes(load_rows(p)) for p in (jsonl, parquet, _write_csv(tmp_path / "d.csv", ROWS))}
    assert got[".csv"] == got[".parquet"] == got[".jsonl"]
    assert len(set(got[".csv"])) == len(ROWS)


def test_a_csv_line_with_more_cells_than_names_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("text\nfine\nsplit, by a comma\n")
    with pytest.raises(DataError, match=r"d\.csv:3: 2 cells under 1 column names; quote cells"):
        load_rows(path)


def test_parquet_without_pyarrow_says_what_to_install(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1")
    # A fresh interpreter in which pyarrow cannot be imported, as on a host without it.
    code = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "from steadytune.data.rows import DataError, load_rows\n"
        f"try:\n    load_rows({str(path)!r})\nexcept DataError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": ""},
        check=True,
    )
    assert "needs pyarrow, which is not installed; `pip install pyarrow`" in out.stdout


def test_an_unknown_suffix_names_the_ones_it_reads(tmp_path: Path) -> None:
    path = tmp_path / "d.tsv"
    path.write_text("text\n")
    with pytest.raises(DataError, match=r"unsupported file type '\.tsv'; use \.jsonl, .*\.parquet"):
        load_rows(path)

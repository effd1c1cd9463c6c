"""The labelled real-log corpus (benchmarks/corpus) is what its SOURCES.tsv says, byte for byte."""

from __future__ import annotations

import csv
import gzip
import hashlib
from pathlib import Path

import pytest

from steadytune.detect.scoring import GROUP_KINDS, read_labels

CORPUS = Path(__file__).resolve().parents[3] / "benchmarks" / "corpus"
RESERVED = CORPUS.parents[2] / "shared" / "data" / "reserved-repos.sha256"


def sources() -> list[dict[str, str]]:
    with open(CORPUS / "SOURCES.tsv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


@pytest.mark.parametrize("row", sources(), ids=lambda r: r["id"])
def test_each_log_is_the_bytes_its_source_names(row: dict[str, str]) -> None:
    stored = CORPUS / "logs" / row["stored_as"]
    raw = stored.read_bytes()
    if stored.suffix == ".gz":
        assert int(row["bytes"]) > 1 << 20, "only files over 1 MB are stored gzipped"
        raw = gzip.decompress(raw)
    assert len(raw) == int(row["bytes"])
    assert hashlib.sha256(raw).hexdigest() == row["sha256"]
    assert len(row["commit"]) == 40 and row["repo"].count("/") == 1


def test_every_log_is_labelled_and_every_label_names_a_log() -> None:
    labels = read_labels(CORPUS / "LABELS.tsv")
    files = {r["file"] for r in sources()}
    assert set(labels) == files
    assert {p.name for p in (CORPUS / "logs").iterdir()} == {r["stored_as"] for r in sources()}
    for name, rows in labels.items():
        classes = {r.cls for r in rows}
        assert len(classes) == 1, f"{name}: one class per file"
        if "positive" in classes:
            for r in rows:
                assert r.group in GROUP_KINDS and r.start <= r.end, (name, r)
        else:
            assert len(rows) == 1, f"{name}: a negative or ambiguous file has one row"


def test_no_log_comes_from_a_reserved_repository() -> None:
    if not RESERVED.is_file():
        pytest.skip("the list of reserved repositories is not beside this checkout")
    reserved = {line.strip() for line in RESERVED.read_text().splitlines() if not line.startswith("#")}
    hashed = {hashlib.sha256(r["repo"].lower().encode()).hexdigest(): r["repo"] for r in sources()}
    assert not reserved & set(hashed), [hashed[h] for h in reserved & set(hashed)]


@pytest.mark.parametrize("row", sources(), ids=lambda r: r["id"])
def test_each_log_is_read_at_the_steps_its_labels_count(row: dict[str, str]) -> None:
    """Every log of the corpus reads (a log the tool cannot read is an anomaly it cannot catch), and
    each labelled window holds steps the reader gives: the labels count the file's own steps."""
    from steadytune.importers import load

    series = load(CORPUS / "logs" / row["stored_as"])
    steps = {r.step for r in series.records}
    for label in read_labels(CORPUS / "LABELS.tsv")[row["file"]]:
        if label.cls == "positive":
            assert any(label.start <= s <= label.end for s in steps), (label, min(steps), max(steps))

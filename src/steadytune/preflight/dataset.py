"""Dataset defects, found before a run trips over them.

Two passes, both pure given their inputs:

* :func:`scan_raw` reads the file's bytes (the loader decodes with ``strict`` UTF-8 and
  would stop at the first bad byte, so only the raw bytes can say where every bad line
  is) and parses what it can;
* :func:`content_findings` and :func:`token_stats` judge the rows and their tokenized
  form: empty or whitespace samples, empty answers, duplicates, truncation, samples
  whose labels are all masked, token ids beyond the vocabulary.

Line numbers are the file's (1-based) for JSONL; for other formats they are row numbers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steadytune.data.encode import IGNORE_INDEX


@dataclass
class RawScan:
    """What the bytes of a data file hold."""

    path: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # the source line of each row
    invalid_utf8: list[tuple[int, int]] = field(default_factory=list)  # (line, byte offset in the file)
    bad_json: list[tuple[int, str]] = field(default_factory=list)
    blank_lines: int = 0
    size_bytes: int = 0
    error: str | None = None  # the file could not be read as rows at all


def _decode(raw: bytes, line: int, offset: int, scan: RawScan) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        scan.invalid_utf8.append((line, offset + exc.start))
        return raw.decode("utf-8", errors="replace")


def scan_raw(path: str | Path) -> RawScan:
    """Read a data file's bytes: invalid UTF-8 (with line and offset), bad JSON, blank lines, rows."""
    p = Path(path)
    scan = RawScan(str(p))
    try:
        data = p.read_bytes()
    except OSError as exc:
        scan.error = f"cannot read {p}: {exc.strerror or exc}"
        return scan
    scan.size_bytes = len(data)
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        offset = 0
        for n, raw in enumerate(data.split(b"\n"), 1):
            text = _decode(raw, n, offset, scan)
            offset += len(raw) + 1
            if not text.strip():
                scan.blank_lines += 1 if offset <= len(data) else 0  # the empty tail after the last newline
                continue
            try:
                row = json.loads(text)
            except ValueError as exc:
                scan.bad_json.append((n, str(exc)))
                continue
            if not isinstance(row, dict):
                scan.bad_json.append((n, f"a JSON {type(row).__name__}, not an object"))
                continue
            scan.rows.append(row)
            scan.lines.append(n)
        return scan
    if suffix in (".json", ".csv"):
        text = data.decode("utf-8", errors="replace")
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            scan.invalid_utf8.append((data.count(b"\n", 0, exc.start) + 1, exc.start))
        if suffix == ".json":
            try:
                parsed = json.loads(text)
            except ValueError as exc:
                scan.bad_json.append((getattr(exc, "lineno", 0), str(exc)))
                return scan
            if isinstance(parsed, dict):
                parsed = next(
                    (parsed[k] for k in ("data", "rows", "train") if isinstance(parsed.get(k), list)), parsed
                )
            if not isinstance(parsed, list):
                scan.error = f"{p}: expected a JSON list of objects"
                return scan
            scan.rows = [r for r in parsed if isinstance(r, dict)]
            scan.lines = [i + 1 for i, r in enumerate(parsed) if isinstance(r, dict)]
            return scan
    if scan.invalid_utf8:
        scan.error = "rows not read: the file is not valid UTF-8"
        return scan
    try:
        from steadytune.data.rows import load_rows

        scan.rows = load_rows(p)
        scan.lines = list(range(1, len(scan.rows) + 1))
    except Exception as exc:
        scan.error = str(exc)
    return scan


def _parts(row: dict[str, Any], fmt: str, text_field: str) -> tuple[list[str], str | None]:
    """(every text the sample trains on, its answer or None when the format has none)."""
    if fmt == "text":
        return [str(row.get(text_field) or "")], None
    if fmt == "instruction":
        answer = str(row.get("output") or "")
        return [str(row.get("instruction") or ""), str(row.get("input") or ""), answer], answer
    messages = row.get("messages") or []
    texts = [str(m.get("content") or "") for m in messages if isinstance(m, dict)]
    answers = [
        str(m.get("content") or "") for m in messages if isinstance(m, dict) and m.get("role") == "assistant"
    ]
    return texts, " ".join(answers)


def content_findings(
    rows: list[dict[str, Any]], lines: list[int], fmt: str, text_field: str = "text"
) -> dict[str, list[int]]:
    """Line numbers of empty, whitespace-only, empty-answer and duplicate samples.

    ``duplicate`` lists each repeat (not its first occurrence); ``duplicate_of`` the
    first occurrence of each repeat, in the same order.
    """
    out: dict[str, list[int]] = {
        "empty": [],
        "whitespace": [],
        "empty_answer": [],
        "duplicate": [],
        "duplicate_of": [],
    }
    first: dict[str, int] = {}
    for row, line in zip(rows, lines, strict=True):
        texts, answer = _parts(row, fmt, text_field)
        joined = "".join(texts)
        if not joined:
            out["empty"].append(line)
        elif not joined.strip():
            out["whitespace"].append(line)
        elif answer is not None and not answer.strip():
            out["empty_answer"].append(line)
        key = hashlib.sha256(json.dumps(row, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
        if key in first:
            out["duplicate"].append(line)
            out["duplicate_of"].append(first[key])
        else:
            first[key] = line
    return out


@dataclass(frozen=True)
class TokenStats:
    """The tokenized samples, summarized."""

    samples: int
    total_tokens: int
    longest: int  # after truncation
    p95: int
    truncated: tuple[tuple[int, int], ...]  # (line, untruncated length)
    all_masked: tuple[int, ...]  # lines whose labels carry no loss
    over_vocab: tuple[tuple[int, int], ...]  # (line, largest id)
    longest_untruncated: int = 0


def token_stats(
    encoded: list[dict[str, list[int]]],
    lines: list[int],
    max_seq_length: int,
    vocab_size: int | None,
    true_length: Callable[[int], int] | None = None,
) -> TokenStats:
    """Summarize tokenized samples.

    Args:
        encoded: ``{"input_ids", "labels"}`` per sample, already truncated to ``max_seq_length``.
        lines: the source line of each sample.
        max_seq_length: the configured limit.
        vocab_size: the model's vocabulary; None skips the id check.
        true_length: the untruncated length of sample ``i``; asked only for samples that reach
            the limit (None: every sample at the limit counts as truncated).
    """
    lengths = [len(e["input_ids"]) for e in encoded]
    truncated, masked, over = [], [], []
    longest_raw = max(lengths, default=0)
    for i, (e, line) in enumerate(zip(encoded, lines, strict=True)):
        if lengths[i] >= max_seq_length:
            full = true_length(i) if true_length is not None else max_seq_length + 1
            longest_raw = max(longest_raw, full)
            if full > max_seq_length:
                truncated.append((line, full))
        # Causal LM labels shift by one: the first position never carries loss.
        if not any(t != IGNORE_INDEX for t in e["labels"][1:]):
            masked.append(line)
        if vocab_size is not None:
            top = max([*e["input_ids"], *(t for t in e["labels"] if t != IGNORE_INDEX)], default=0)
            if top >= vocab_size:
                over.append((line, top))
    ordered = sorted(lengths)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else 0
    return TokenStats(
        len(encoded),
        sum(lengths),
        max(lengths, default=0),
        p95,
        tuple(truncated),
        tuple(masked),
        tuple(over),
        longest_raw,
    )


def show_lines(lines: list[int] | tuple[int, ...], limit: int = 5) -> str:
    """``"lines 3, 7, 12 (+4 more)"``."""
    head = ", ".join(str(n) for n in lines[:limit])
    more = f" (+{len(lines) - limit} more)" if len(lines) > limit else ""
    return f"line{'s' if len(lines) > 1 else ''} {head}{more}"

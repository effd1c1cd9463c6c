"""Datasets for the built-in runner: load, detect the format, tokenize, mask, cache.

Three formats: ``text`` (a text column), ``instruction`` (instruction/input/output)
and ``messages`` (chat, rendered with the tokenizer's chat template). Every
sample keeps its row id and a content hash of its tokens, so a batch can be
fingerprinted, inspected later, and skipped by id.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steadytune.guard.fingerprint import sample_hash as _hash_ids

IGNORE_INDEX = -100
SAMPLE_ID = "st_sample_id"
SAMPLE_HASH = "st_sample_hash"

PROMPT_TEMPLATE = "### Instruction:\n{instruction}\n{input_block}### Response:\n"


class DataError(ValueError):
    """A dataset that cannot be used as configured; the message says why and how to fix it."""


@dataclass(frozen=True)
class DataSpec:
    path: str
    format: str = "auto"
    text_field: str = "text"
    max_seq_length: int = 512
    train_on_prompt: bool = False
    max_samples: int | None = None


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl/.json/.csv/.parquet file, as dicts."""
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.exists():
        raise DataError(f"dataset {path} not found; check data.train_file / data.eval_file")
    if suffix in {".jsonl", ".ndjson"}:
        rows = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except ValueError as exc:
                        raise DataError(
                            f"{path}:{n}: not valid JSON ({getattr(exc, 'msg', exc)}); "
                            "fix or remove that line"
                        ) from None
        return rows
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            for key in ("data", "rows", "train"):
                if isinstance(data.get(key), list):
                    return data[key]
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON list of objects")
        return data
    if suffix in {".csv", ".parquet"}:
        import datasets

        kind = "csv" if suffix == ".csv" else "parquet"
        ds = datasets.load_dataset(kind, data_files=str(path), split="train")
        return [dict(r) for r in ds]
    raise DataError(f"{path}: unsupported file type {suffix!r}; use .jsonl, .json, .csv or .parquet")


def detect_format(rows: list[dict[str, Any]], text_field: str = "text") -> str:
    if not rows:
        raise DataError("the dataset is empty")
    keys = set(rows[0])
    if "messages" in keys:
        return "messages"
    if {"instruction", "output"} <= keys:
        return "instruction"
    if text_field in keys:
        return "text"
    raise DataError(
        f"cannot tell the data format from the columns {sorted(keys)}; expected '{text_field}', "
        "'instruction'/'input'/'output' or 'messages' (or set data.format and data.text_field)"
    )


def _encode_pair(tok: Any, prompt: str, answer: str, spec: DataSpec) -> dict[str, list[int]]:
    p_ids = tok(prompt, add_special_tokens=False).input_ids
    if tok.bos_token_id is not None:
        p_ids = [tok.bos_token_id, *p_ids]
    a_ids = tok(answer, add_special_tokens=False).input_ids
    if tok.eos_token_id is not None:
        a_ids = [*a_ids, tok.eos_token_id]
    ids = (p_ids + a_ids)[: spec.max_seq_length]
    labels = (p_ids if spec.train_on_prompt else [IGNORE_INDEX] * len(p_ids)) + a_ids
    return {"input_ids": ids, "labels": labels[: spec.max_seq_length]}


def _encode_messages(tok: Any, messages: list[dict[str, str]], spec: DataSpec) -> dict[str, list[int]]:
    if not getattr(tok, "chat_template", None):
        raise DataError(
            "the messages format needs a tokenizer with a chat template; use format text or instruction"
        )
    ids: list[int] = []
    labels: list[int] = []
    for i, msg in enumerate(messages):
        rendered = tok.apply_chat_template(messages[: i + 1], tokenize=True, add_generation_prompt=False)
        # transformers 5 returns a BatchEncoding (a mapping); older versions a plain list.
        rendered = list(rendered if isinstance(rendered, list) else rendered["input_ids"])
        new = rendered[len(ids) :]
        ids.extend(new)
        train_this = msg.get("role") == "assistant" or spec.train_on_prompt
        labels.extend(new if train_this else [IGNORE_INDEX] * len(new))
    return {"input_ids": ids[: spec.max_seq_length], "labels": labels[: spec.max_seq_length]}


def encode_row(tok: Any, row: dict[str, Any], fmt: str, spec: DataSpec) -> dict[str, list[int]]:
    if fmt == "text":
        ids = tok(str(row.get(spec.text_field) or ""), add_special_tokens=False).input_ids
        if tok.bos_token_id is not None:
            ids = [tok.bos_token_id, *ids]
        if tok.eos_token_id is not None:
            ids = [*ids, tok.eos_token_id]
        ids = ids[: spec.max_seq_length]
        return {"input_ids": ids, "labels": list(ids)}
    if fmt == "instruction":
        inp = str(row.get("input") or "")
        prompt = PROMPT_TEMPLATE.format(
            instruction=row.get("instruction") or "", input_block=f"### Input:\n{inp}\n" if inp else ""
        )
        return _encode_pair(tok, prompt, str(row.get("output") or ""), spec)
    if fmt == "messages":
        return _encode_messages(tok, list(row.get("messages") or []), spec)
    raise DataError(f"unknown data format {fmt!r}")


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> Any:
    """The tokenizer exactly as the runner prepares it (the pad token is part of the cache key)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def tokenizer_fingerprint(tok: Any) -> str:
    vocab = json.dumps(sorted(tok.get_vocab().items()))
    extra = json.dumps(
        [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, getattr(tok, "chat_template", None)]
    )
    return hashlib.sha256((vocab + extra).encode()).hexdigest()[:16]


def cache_key(spec: DataSpec, tok: Any, fmt: str) -> str:
    h = hashlib.sha256()
    with open(spec.path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    h.update(
        json.dumps(
            [
                fmt,
                spec.text_field,
                spec.max_seq_length,
                spec.train_on_prompt,
                spec.max_samples,
                PROMPT_TEMPLATE,
                tokenizer_fingerprint(tok),
            ]
        ).encode()
    )
    return h.hexdigest()[:24]


def data_cache_dir() -> Path:
    env = os.environ.get("STEADYTUNE_DATA_CACHE")
    if env:
        return Path(env)
    from steadytune.train.assets import default_cache_dir

    return default_cache_dir() / "data"


def build_dataset(tok: Any, spec: DataSpec, cache: bool = True) -> Any:
    """A HF ``datasets.Dataset`` of tokenized samples with ids and hashes, cached by content.

    The cache key covers the file's bytes, the tokenizer, the template and the
    sequence length, so any change rebuilds; a restart reuses the cached copy.
    """
    import datasets

    rows = load_rows(spec.path)
    if spec.max_samples:
        rows = rows[: spec.max_samples]
    fmt = spec.format if spec.format != "auto" else detect_format(rows, spec.text_field)
    target = data_cache_dir() / cache_key(spec, tok, fmt) if cache else None
    if target is not None and (target / "dataset_info.json").exists():
        try:
            ds = datasets.load_from_disk(str(target))
            _touch(target / CACHE_META)  # last use, for `steadytune cache clean` (least recently used first)
            return ds
        except Exception:
            shutil.rmtree(target, ignore_errors=True)  # a damaged cache entry is rebuilt, never trusted
    encoded = []
    for i, row in enumerate(rows):
        enc: dict[str, Any] = encode_row(tok, row, fmt, spec)
        enc[SAMPLE_ID] = i
        enc[SAMPLE_HASH] = _hash_ids(enc["input_ids"])
        encoded.append(enc)
    ds = datasets.Dataset.from_list(encoded)
    if target is not None:
        tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        ds.save_to_disk(str(tmp))
        _write_meta(tmp / CACHE_META, target.name, spec, tok, fmt, len(ds))
        try:
            os.replace(tmp, target)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        ds = datasets.load_from_disk(str(target)) if target.exists() else ds
    return ds


# What `steadytune cache ls` shows about an entry; written inside the entry before it is renamed
# into place, so an entry never exists without it (entries built before it existed have none).
CACHE_META = "meta.json"


def _write_meta(path: Path, key: str, spec: DataSpec, tok: Any, fmt: str, samples: int) -> None:
    import time

    meta = {
        "key": key,
        "source": str(Path(spec.path).resolve()),
        "format": fmt,
        "max_seq_length": spec.max_seq_length,
        "train_on_prompt": spec.train_on_prompt,
        "tokenizer": str(getattr(tok, "name_or_path", "")),
        "tokenizer_hash": tokenizer_fingerprint(tok),
        "samples": samples,
        "created": time.time(),
    }
    path.write_text(json.dumps(meta, indent=1), encoding="utf-8")


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass  # no meta (an older entry) or a read-only cache: the entry is still good

"""Datasets for the built-in runner: the tokenizer, the tokenized ``datasets.Dataset``, its cache.

Reading rows and encoding them live in :mod:`steadytune.data` (torch-free, shared with
inspect-batch). Every sample keeps its row id and a content hash of its tokens, so a
batch can be fingerprinted, inspected later, and skipped by id.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from steadytune.data.encode import PROMPT_TEMPLATE, DataSpec, encode_row, sample_hash
from steadytune.data.rows import ROWS_READER, detect_format, load_rows

SAMPLE_ID = "st_sample_id"
SAMPLE_HASH = "st_sample_hash"


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
                ROWS_READER,
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
        enc[SAMPLE_HASH] = sample_hash(enc["input_ids"])
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

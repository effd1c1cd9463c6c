"""Rows to token ids and labels, and the hash of a sample's tokens: stdlib only.

Three formats: ``text`` (a text column), ``instruction`` (instruction/input/output)
and ``messages`` (chat, rendered with the tokenizer's chat template). The tokenizer is
passed in, so the worker's HF tokenizer and forensics' light one encode alike.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from steadytune.data.rows import DataError

IGNORE_INDEX = -100

PROMPT_TEMPLATE = "### Instruction:\n{instruction}\n{input_block}### Response:\n"


@dataclass(frozen=True)
class DataSpec:
    path: str
    format: str = "auto"
    text_field: str = "text"
    max_seq_length: int = 512
    train_on_prompt: bool = False
    max_samples: int | None = None


def sample_hash(ids: list[int]) -> int:
    """A 60-bit hash of one sample's token ids (fits in a signed int64 tensor).

    One function hashes a sample wherever it is seen (the built-in runner at dataset build
    time, the injected guard from a collated batch, forensics when it re-tokenizes), so a
    hash recorded by one can be checked by another.
    """
    digest = hashlib.blake2b(json.dumps(ids).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 4


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

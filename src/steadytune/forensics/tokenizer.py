"""A tokenizer for forensics that does not drag torch into the supervisor.

``transformers.AutoTokenizer`` imports torch, and the supervisor must never do
that (it has to outlive CUDA failures). Most fine-tuning tokenizers ship a
``tokenizer.json`` that the Rust ``tokenizers`` library loads directly, so this
module wraps it with the few attributes :func:`steadytune.data.encode.encode_row`
uses. Chat templates need transformers: :func:`load_tokenizer` only falls back to
it when the caller allows it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TokenizerUnavailable(RuntimeError):
    """No tokenizer could be loaded under the constraints given."""


@dataclass(frozen=True)
class _Encoding:
    input_ids: list[int]


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older tokenizer configs
        value = value.get("content")
    return value if isinstance(value, str) else None


class LightTokenizer:
    """The subset of a HF fast tokenizer that data encoding and batch checks need."""

    chat_template = None  # rendering a chat template needs transformers (jinja + its helpers)

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        self.folder = folder
        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        try:
            cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            cfg = {}
        self.bos_token_id = self._id(_token_text(cfg.get("bos_token")))
        self.eos_token_id = self._id(_token_text(cfg.get("eos_token")))
        self.unk_token_id = self._id(_token_text(cfg.get("unk_token")))
        self.pad_token_id = self._id(_token_text(cfg.get("pad_token")))
        if self.pad_token_id is None:
            self.pad_token_id = self.eos_token_id  # what the runner does (train/runner.py load_tokenizer)
        decoder = (
            self._tok.get_added_tokens_decoder() if hasattr(self._tok, "get_added_tokens_decoder") else {}
        )
        added = [int(i) for i, t in decoder.items() if getattr(t, "special", False)]
        ids = {
            i
            for i in (self.bos_token_id, self.eos_token_id, self.unk_token_id, self.pad_token_id)
            if i is not None
        }
        self.all_special_ids = sorted(ids | set(added))

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    def __call__(self, text: str, add_special_tokens: bool = True) -> _Encoding:
        return _Encoding(list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids))

    def __len__(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def get_vocab(self) -> dict[str, int]:
        return dict(self._tok.get_vocab(with_added_tokens=True))

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        return [self._tok.id_to_token(i) for i in ids]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))


def load_tokenizer(
    folder: str | Path,
    needs_chat_template: bool = False,
    allow_transformers: bool = False,
    trust_remote_code: bool = False,
) -> Any:
    """The run's tokenizer: the light one when it suffices, else transformers (if allowed).

    Raises:
        TokenizerUnavailable: when only transformers could load it and that is not allowed.
    """
    folder = Path(folder)
    light_ok = (folder / "tokenizer.json").is_file() and not needs_chat_template
    if light_ok:
        try:
            return LightTokenizer(folder)
        except Exception as exc:  # a tokenizer.json the Rust library rejects: let transformers try
            reason = f"tokenizers could not read {folder / 'tokenizer.json'}: {exc}"
    else:
        reason = "the data uses a chat template" if needs_chat_template else f"{folder} has no tokenizer.json"
    if not allow_transformers:
        raise TokenizerUnavailable(
            f"{reason}; loading it needs transformers (and torch), "
            "which this process must not import; run `steadytune inspect-batch` instead"
        )
    return load_hf_tokenizer(folder, trust_remote_code)


def load_hf_tokenizer(folder: str | Path, trust_remote_code: bool = False) -> Any:
    """The tokenizer exactly as the runner loads it (transformers; imports torch)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def vocab_size(model_folder: str | Path, tok: Any) -> int:
    """The model's vocabulary size (its embedding rows), falling back to the tokenizer's."""
    try:
        cfg = json.loads((Path(model_folder) / "config.json").read_text(encoding="utf-8"))
        size = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
        if isinstance(size, int) and size > 0:
            return size
    except (FileNotFoundError, ValueError, OSError):
        pass
    return len(tok)

"""Content hashes of tokenized samples: what a batch fingerprint says a step trained on.

One function hashes a sample wherever it is seen (the built-in runner at dataset build
time, the injected guard from a collated batch, forensics when it re-tokenizes), so a
hash recorded by one can be checked by another. Stdlib only: the injected guard runs
in a tool's own virtualenv.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def sample_hash(ids: list[int]) -> int:
    """A 60-bit hash of one sample's token ids (fits in a signed int64 tensor)."""
    digest = hashlib.blake2b(json.dumps(ids).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 4


def batch_hashes(input_ids: Any, attention_mask: Any = None) -> list[int] | None:
    """The hash of every row of a collated ``[batch, seq]`` batch, padding left out.

    The attention mask tells real tokens from padding, so a row hashes the same as the
    sample it was padded from. None when ``input_ids`` is not a 2-d tensor (nothing to hash).
    """
    if getattr(input_ids, "dim", None) is None or input_ids.dim() != 2:
        return None
    rows = input_ids.detach().cpu().tolist()
    if attention_mask is not None and getattr(attention_mask, "shape", None) == input_ids.shape:
        mask = attention_mask.detach().cpu().tolist()
        rows = [
            [t for t, m in zip(row, keep, strict=True) if m] for row, keep in zip(rows, mask, strict=True)
        ]
    return [sample_hash(row) for row in rows]

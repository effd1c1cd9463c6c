"""Content hashes of tokenized samples: what a batch fingerprint says a step trained on.

The hash of one sample is :func:`steadytune.data.encode.sample_hash`, shared with the
built-in runner and forensics; this module applies it to a collated batch. Stdlib only:
the injected guard runs in a tool's own virtualenv.
"""

from __future__ import annotations

from typing import Any

from steadytune.data.encode import sample_hash


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

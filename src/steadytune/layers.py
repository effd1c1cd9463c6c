"""Group parameter names into layers, in forward order. Pure, shared by diff-ckpt and gradflow.

``model.layers.3.mlp.up_proj.weight`` belongs to ``layers.3``; embeddings come
first, then the blocks by index, then anything else, the final norm and the
head. PEFT (``base_model.model.``), DDP (``module.``) and ``torch.compile``
(``_orig_mod.``) prefixes are ignored, so a LoRA adapter and its base model
group the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_PREFIXES = ("base_model.model.", "module.", "_orig_mod.")
_BLOCK = re.compile(
    r"^(?P<stack>(?:[A-Za-z_]\w*\.)*?(?:layers|layer|h|blocks|block))\.(?P<index>\d+)(?:\.|$)"
)
_EMBED = (
    "embed_tokens",
    "wte",
    "wpe",
    "word_embeddings",
    "position_embeddings",
    "embed_in",
    "tok_embeddings",
    "embeddings",
)
_HEAD = ("lm_head", "embed_out", "output", "score")
_FINAL_NORM = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "final_norm")

EMBEDDINGS, FINAL_NORM, LM_HEAD = "embeddings", "final_norm", "lm_head"


def strip_prefixes(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for p in _PREFIXES:
            if name.startswith(p):
                name, changed = name[len(p) :], True
    return name


def layer_of(name: str) -> tuple[str, tuple[int, int, str]]:
    """``(layer name, sort key)`` of a parameter; sorting by the key gives forward order."""
    bare = strip_prefixes(name)
    inner = bare[len("model.") :] if bare.startswith("model.") else bare
    for prefix in ("transformer.", "gpt_neox.", "decoder.", "language_model.model.", "language_model."):
        if inner.startswith(prefix) and _BLOCK.match(inner[len(prefix) :]):
            inner = inner[len(prefix) :]
            break
    m = _BLOCK.match(inner)
    if m:
        stack = m.group("stack").rsplit(".", 1)[-1]
        stack = "layers" if stack in {"layer", "h", "block", "blocks"} else stack
        index = int(m.group("index"))
        return f"{stack}.{index}", (1, index, "")
    parts = inner.split(".")
    if any(p in _EMBED for p in parts[:-1]):
        return EMBEDDINGS, (0, 0, "")
    head = parts[0] if len(parts) > 1 else ""
    if head in _HEAD or (len(parts) > 2 and parts[-2] in _HEAD):
        return LM_HEAD, (4, 0, "")
    if any(p in _FINAL_NORM for p in parts[:-1]):
        return FINAL_NORM, (3, 0, "")
    module = ".".join(parts[:-1]) or parts[0]
    return module, (2, 0, module)


def forward_order(names: Iterable[str]) -> list[str]:
    """Layer names of ``names`` (parameter names), each once, in forward order."""
    keys: dict[str, tuple[int, int, str]] = {}
    for n in names:
        layer, key = layer_of(n)
        keys.setdefault(layer, key)
    return sorted(keys, key=lambda k: keys[k])

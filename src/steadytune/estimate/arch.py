"""A decoder-only transformer as the estimator needs it, read straight from ``config.json``.

No torch and no transformers here: parsing the JSON and multiplying shapes is enough to
count every parameter of a Llama/Mistral/Qwen2/Qwen3-style model exactly, which is what
keeps ``steadytune estimate`` under two seconds and free of downloads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Model types whose HF implementation matches the layout below (pre-norm RMSNorm, RoPE,
# separate q/k/v/o projections, gated MLP with gate/up/down projections).
KNOWN_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
LINEAR_MODULES = ATTENTION_MODULES + MLP_MODULES


class ArchitectureError(ValueError):
    """The config cannot be read as a supported decoder-only architecture."""


@dataclass(frozen=True)
class Linear:
    """One linear projection inside a decoder layer."""

    name: str
    in_features: int
    out_features: int
    bias: bool

    @property
    def params(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias else 0)


@dataclass(frozen=True)
class Architecture:
    """The shapes of a decoder-only causal LM; every count below is derived from them."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    hidden_act: str = "silu"

    def linears(self) -> tuple[Linear, ...]:
        """The linear projections of one decoder layer, in execution order."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        i = self.intermediate_size
        return (
            Linear("q_proj", h, q, self.attention_bias),
            Linear("k_proj", h, kv, self.attention_bias),
            Linear("v_proj", h, kv, self.attention_bias),
            # Qwen2 puts a bias on q/k/v only, never on o_proj.
            Linear("o_proj", q, h, self.attention_bias and self.model_type != "qwen2"),
            Linear("gate_proj", h, i, self.mlp_bias),
            Linear("up_proj", h, i, self.mlp_bias),
            Linear("down_proj", i, h, self.mlp_bias),
        )

    def module_name(self, layer: int, linear: str) -> str:
        """The module's name as PEFT matches ``rank_pattern`` against it (HF Llama-style layout)."""
        block = "self_attn" if linear in ATTENTION_MODULES else "mlp"
        return f"model.layers.{layer}.{block}.{linear}"

    @property
    def layer_norm_params(self) -> int:
        """RMSNorm weights of one layer (two norms, plus Qwen3's per-head q/k norms)."""
        return 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def layer_linear_params(self) -> int:
        return sum(lin.params for lin in self.linears())

    @property
    def layer_params(self) -> int:
        return self.layer_linear_params + self.layer_norm_params

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Parameters of the output projection that are not shared with the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        return (
            self.embedding_params
            + self.lm_head_params
            + self.num_layers * self.layer_params
            + self.hidden_size  # final norm
        )

    @property
    def largest_linear_params(self) -> int:
        return max(lin.in_features * lin.out_features for lin in self.linears())


def _get(d: dict[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if d.get(name) is not None:
            return d[name]
    return default


def architecture_from_dict(config: dict[str, Any]) -> Architecture:
    """Build an :class:`Architecture` from the dict of a HF ``config.json``.

    Args:
        config: the parsed JSON. Multimodal wrappers are unwrapped through ``text_config``.

    Returns:
        The architecture.

    Raises:
        ArchitectureError: a required key is missing or the model is a mixture of experts;
            the message lists every problem at once.
    """
    if isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], "model_type": config["text_config"].get("model_type", "")}
    problems: list[str] = []
    required = {
        "hidden_size": ("hidden_size", "n_embd", "d_model"),
        "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
        "num_attention_heads": ("num_attention_heads", "n_head"),
        "intermediate_size": ("intermediate_size", "ffn_dim"),
        "vocab_size": ("vocab_size",),
    }
    values: dict[str, int] = {}
    for key, aliases in required.items():
        value = _get(config, *aliases)
        if not isinstance(value, int) or value <= 0:
            problems.append(f"{key} is missing or not a positive integer (got {value!r})")
        else:
            values[key] = value
    if _get(config, "num_local_experts", "num_experts", "n_routed_experts"):
        problems.append(
            "mixture-of-experts configs are not supported yet (num_local_experts/num_experts is set)"
        )
    if problems:
        raise ArchitectureError("config.json cannot be estimated: " + "; ".join(problems))

    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    model_type = str(config.get("model_type", "")).lower()
    return Architecture(
        model_type=model_type,
        hidden_size=hidden,
        num_layers=values["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=int(_get(config, "num_key_value_heads", default=heads)),
        head_dim=int(_get(config, "head_dim", default=hidden // heads)),
        intermediate_size=values["intermediate_size"],
        vocab_size=values["vocab_size"],
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        # Qwen2 has biases on q/k/v without saying so in its config.
        attention_bias=bool(config.get("attention_bias", model_type == "qwen2")),
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
        hidden_act=str(config.get("hidden_act", "silu")),
    )


def load_architecture(path: str | Path) -> Architecture:
    """Read a model directory or a ``config.json`` file; no weights are needed.

    Args:
        path: a directory that holds ``config.json``, or the JSON file itself.

    Raises:
        ArchitectureError: the file is missing, is not JSON, or lacks required keys.
    """
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    if not file.is_file():
        raise ArchitectureError(
            f"no config.json at {str(path)!r}; pass a local model directory or a config.json file "
            "(the Hub is not contacted, download the config first)"
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ArchitectureError(f"cannot read {str(file)!r} as JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ArchitectureError(f"{str(file)!r} does not hold a JSON object")
    return architecture_from_dict(data)

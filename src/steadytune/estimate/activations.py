"""Activation memory: what autograd keeps for backward, per token, tensor by tensor.

The counts follow the HF transformers Llama/Mistral/Qwen2 forward as autograd sees it
(``torch.autograd`` saved tensors, checked against the graph of a real model):

* RMSNorm upcasts its input to fp32 and keeps it (``pow``) plus the fp32 ``rsqrt``
  (4 bytes per token); a trainable norm weight also keeps the normalized input.
* A linear layer keeps its input only when its weight trains (the weight gradient needs
  it). Under autocast, an input whose dtype differs from the compute dtype is cast by
  *each* linear separately, because autocast caches casts of leaf weights, not of
  activations: three bf16 copies for q/k/v when the residual stream is fp32.
* A PEFT LoRA module casts its input to the adapter dtype (fp32) and autocast casts it
  back, so under autocast every adapted projection keeps its own copy, plus the rank-r
  output of ``lora_A``.
* SDPA (flash / memory-efficient) and FlashAttention-2 keep q, k, v, the output and the
  fp32 log-sum-exp; k and v stay at the key/value-head width (GQA without repeat).
  Eager attention keeps the repeated k and v, the fp32 softmax probabilities and their
  compute-dtype copy: the (heads x seq) per token term that grows with seq**2.
* The gated MLP keeps the gate output, the activation output and the up output.
* Nothing before the first parameter that trains keeps anything: with LoRA the first
  input norm keeps nothing, with ``freeze`` the frozen layers keep nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from steadytune.estimate.arch import ATTENTION_MODULES, MLP_MODULES, Architecture
from steadytune.estimate.setup import DTYPE_BYTES, TrainSetup

# Bytes per element of the dropout mask kept by PEFT's lora_dropout (CUDA keeps a bool).
_DROPOUT_MASK_BYTES = 1


@dataclass(frozen=True)
class LayerActivations:
    """Bytes per token that one decoder layer keeps for backward."""

    attention: float = 0.0
    mlp: float = 0.0
    norms: float = 0.0

    @property
    def total(self) -> float:
        return self.attention + self.mlp + self.norms


@dataclass(frozen=True)
class Precision:
    """Element sizes that decide which tensors are copies and which are shared."""

    compute: int  # activations out of linears / attention
    residual: int  # the residual stream between layers
    autocast: bool
    adapter: int  # LoRA weights


def precision(setup: TrainSetup) -> Precision:
    """Element sizes for ``setup`` (see the module docstring for why they matter)."""
    e = setup.compute_bytes
    if setup.zero_stage or setup.fsdp:
        # DeepSpeed casts the whole model to the compute dtype; FSDP gathers parameters in
        # it. Either way activations look like pure precision.
        return Precision(compute=e, residual=e, autocast=False, adapter=e)
    autocast = setup.mixed_precision and setup.dtype != "fp32"
    embedding = DTYPE_BYTES[setup.trainable_dtype if setup.method == "full" else setup.frozen_weights_dtype]
    # fp32 embeddings + bf16 linear outputs promote the residual stream to fp32 under autocast.
    residual = max(embedding, e) if autocast else embedding
    adapter = 4 if setup.mixed_precision else e
    return Precision(compute=e, residual=residual, autocast=autocast, adapter=adapter)


def layer_weight_bytes(setup: TrainSetup, trainable: bool) -> int:
    """Element size of a decoder layer's (non-quantized) weights, norms included."""
    if trainable:
        return DTYPE_BYTES[setup.trainable_dtype]
    return DTYPE_BYTES[setup.frozen_weights_dtype]


def _group_bytes(
    width: int,
    input_bytes: int,
    base_consumers: int,
    lora_consumers: int,
    setup: TrainSetup,
    p: Precision,
    already_saved: bool = False,
) -> float:
    """Bytes per token kept for the inputs of the projections that read one tensor."""
    shared = False
    copies = 0
    masks = 0
    for _ in range(base_consumers):
        if p.autocast and input_bytes != p.compute:
            copies += 1
        else:
            shared = True
    for _ in range(lora_consumers):
        if setup.lora_dropout > 0:
            copies += 1
            masks += 1
        elif p.autocast or p.adapter != input_bytes:
            copies += 1
        else:
            shared = True
    kept = copies * p.compute * width + masks * _DROPOUT_MASK_BYTES * width
    if shared and not already_saved:
        kept += input_bytes * width
    # A rank_pattern's largest rank: these r values per token are small next to the inputs.
    lora_outputs = lora_consumers * setup.max_lora_r * (p.compute if p.autocast else p.adapter)
    return kept + lora_outputs


def _math_sdpa(arch: Architecture, setup: TrainSetup) -> bool:
    """Whether CUDA SDPA falls back to its math kernel, which keeps the probabilities.

    transformers asks SDPA for native GQA (``enable_gqa``); in fp32 only the math kernel
    offers it on CUDA (flash needs 16-bit inputs), and the math kernel materialises the
    attention matrix like eager attention does.
    """
    return (
        setup.device == "cuda"
        and setup.attn == "sdpa"
        and precision(setup).compute == 4
        and arch.num_kv_heads != arch.num_heads
    )


def layer_activations(
    arch: Architecture, setup: TrainSetup, trainable: bool, grad_in: bool
) -> LayerActivations:
    """Bytes per token one decoder layer keeps for backward.

    Args:
        arch: the architecture.
        setup: the training setup.
        trainable: the layer's base weights (linears and norms) train.
        grad_in: the layer's input requires grad (something before it trains).

    Returns:
        The bytes per token, split into attention (with its projections and adapters),
        MLP and norms.
    """
    p = precision(setup)
    e = p.compute
    h, i = arch.hidden_size, arch.intermediate_size
    a, d, kv = arch.num_heads, arch.head_dim, arch.num_kv_heads
    lora = set(setup.lora_modules)
    base = set(ATTENTION_MODULES + MLP_MODULES) if trainable else set()
    weight = layer_weight_bytes(setup, trainable)
    norm_out = max(weight, p.residual)
    attn_has = bool((base | lora) & set(ATTENTION_MODULES))
    mlp_has = bool((base | lora) & set(MLP_MODULES))

    def count(names: tuple[str, ...], pool: set[str]) -> int:
        return sum(1 for n in names if n in pool)

    def norm(grad: bool) -> float:
        kept = (4 * h + 4) if grad else 0
        return kept + (p.residual * h if trainable else 0)

    grad = grad_in
    norms = norm(grad)
    attention = _group_bytes(
        h,
        norm_out,
        count(("q_proj", "k_proj", "v_proj"), base),
        count(("q_proj", "k_proj", "v_proj"), lora),
        setup,
        p,
    )
    if (grad or attn_has) and arch.qk_norm:
        # Qwen3 RMS-normalizes q and k per head: fp32 copies and rsqrt, plus the normalized
        # input when the norm weights train.
        width = a * d + kv * d
        attention += 4 * width + 4 * (a + kv) + (e * width if trainable else 0)
    if grad or attn_has:
        if setup.attn == "eager" or _math_sdpa(arch, setup):
            rep = a * d if a != kv else kv * d
            attention += e * (a * d + 2 * rep) + (4 + (e if e != 4 else 0)) * a * setup.seq
        else:
            attention += e * (2 * a * d + 2 * kv * d) + 4 * a
    attention += _group_bytes(
        a * d,
        e,
        count(("o_proj",), base),
        count(("o_proj",), lora),
        setup,
        p,
        already_saved=setup.attn != "eager",
    )
    grad = grad or attn_has
    norms += norm(grad)
    mlp = _group_bytes(
        h, norm_out, count(("gate_proj", "up_proj"), base), count(("gate_proj", "up_proj"), lora), setup, p
    )
    if grad or mlp_has:
        mlp += 3 * e * i
    mlp += _group_bytes(i, e, count(("down_proj",), base), count(("down_proj",), lora), setup, p)
    return LayerActivations(attention=attention, mlp=mlp, norms=norms)


@dataclass(frozen=True)
class HeadActivations:
    """Bytes per token kept outside the decoder layers, and the loss's peak buffers."""

    inputs: float  # input ids, labels
    final_norm: float
    lm_head_input: float
    log_softmax: float  # fp32 log-probabilities kept by cross-entropy
    forward_extra: float  # logits and their fp32 upcast, alive at the end of forward
    backward_extra: float  # gradients of the log-probabilities at the start of backward

    @property
    def saved(self) -> float:
        return self.inputs + self.final_norm + self.lm_head_input + self.log_softmax


def head_activations(arch: Architecture, setup: TrainSetup) -> HeadActivations:
    """Per-token bytes of the final norm, the LM head and the cross-entropy loss."""
    p = precision(setup)
    e, h, v = p.compute, arch.hidden_size, arch.vocab_size
    head_trains = setup.method == "full"
    # ids + padded and shifted labels (int64); the embedding keeps the ids when it trains.
    inputs = 8 * 3 + (8 if head_trains else 0)
    final_norm = 4 * h + 4 + (p.residual * h if head_trains else 0)
    norm_out = p.residual
    lm_head_input = 0.0
    if head_trains:
        lm_head_input = e * h if (p.autocast and norm_out != e) else norm_out * h
    # HF's ForCausalLMLoss upcasts logits to fp32, log_softmax keeps its fp32 output, and
    # the compute-dtype logits stay referenced by the model output until forward returns.
    upcast = 4 * v if e != 4 else 0
    forward_extra = e * v + upcast
    # nll_loss backward materialises a dense fp32 (tokens x vocab) gradient, and
    # log_softmax backward another one, while the saved log-probabilities are still alive.
    backward_extra = 8 * v
    return HeadActivations(
        inputs=inputs,
        final_norm=final_norm,
        lm_head_input=lm_head_input,
        log_softmax=4 * v,
        forward_extra=forward_extra,
        backward_extra=backward_extra,
    )


def checkpointed_layer_bytes(arch: Architecture, setup: TrainSetup) -> float:
    """Per token, per layer, what non-reentrant checkpointing keeps: the layer input."""
    return float(precision(setup).residual * arch.hidden_size)

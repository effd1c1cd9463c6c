"""The estimator: peak memory per device of one training step, from shapes alone.

A training step is a sequence of moments, and the peak is the largest of them:

``forward``   everything saved for backward plus the logits and their fp32 upcast;
``loss``      the start of backward, when cross-entropy's dense (tokens x vocab)
              gradients sit next to every saved activation;
``top``       the first decoder layers' backward: activations still alive, the LM head's
              and top layer's gradients already allocated;
``bottom``    the end of backward: all gradients, the last layer's activations;
``optimizer`` gradients plus optimizer states (and the step's scratch buffers).

Optimizer states exist in every moment (the steady state from the second step on), so
the estimate is the peak of a long run, not of its first step. With gradient
accumulation the gradients are alive in every moment too.

Each moment is a dict of components; the breakdown of the largest one is returned, so
its parts always sum to the peak. On CUDA the CUDA context and an allocator margin are
added on top of the tensor peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from steadytune.estimate.activations import (
    HeadActivations,
    LayerActivations,
    checkpointed_layer_bytes,
    head_activations,
    layer_activations,
    layer_weight_bytes,
    precision,
)
from steadytune.estimate.arch import Architecture
from steadytune.estimate.setup import DTYPE_BYTES, TrainSetup
from steadytune.estimate.states import (
    ModelStates,
    ParamCounts,
    lora_params_per_layer,
    model_states,
    param_counts,
)

# The order in which components are shown; JSON output keeps it too.
COMPONENTS = (
    "weights",
    "adapters",
    "quantization_constants",
    "gradients",
    "optimizer_states",
    "activations",
    "logits_loss",
    "temporaries",
    "cuda_context",
    "allocator_margin",
)


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimated peak of one device and where it comes from.

    Attributes:
        peak_bytes: tensor peak plus CUDA context plus allocator margin.
        breakdown: bytes per component (see :data:`COMPONENTS`); sums to ``peak_bytes``.
        phase: the moment of the step where the peak happens.
        phases: tensor bytes at every moment considered.
        activation_detail: saved-for-backward bytes over the whole forward, split into
            attention, mlp, norms (all layers) and head (final norm, LM head, inputs).
        params: parameter counts by role.
    """

    peak_bytes: int
    breakdown: dict[str, int]
    phase: str
    phases: dict[str, int] = field(default_factory=dict)
    activation_detail: dict[str, int] = field(default_factory=dict)
    params: ParamCounts | None = None

    @property
    def tensor_bytes(self) -> int:
        """The peak as ``torch.cuda.max_memory_allocated`` would report it."""
        return (
            self.peak_bytes
            - self.breakdown.get("cuda_context", 0)
            - self.breakdown.get("allocator_margin", 0)
        )

    @property
    def reserved_bytes(self) -> int:
        """The peak as ``torch.cuda.max_memory_reserved`` would report it."""
        return self.peak_bytes - self.breakdown.get("cuda_context", 0)


def _layer_plan(arch: Architecture, setup: TrainSetup) -> list[tuple[bool, bool]]:
    """(trainable, input requires grad) for each decoder layer."""
    n = arch.num_layers
    if setup.method == "full":
        return [(True, True)] * n
    if setup.method == "freeze":
        first = n - min(setup.freeze_trainable_layers, n)
        return [(i >= first, i > first) for i in range(n)]
    return [(False, i > 0) for i in range(n)]


def _in_grad_region(setup: TrainSetup, trainable: bool, grad_in: bool) -> bool:
    """Whether autograd records the layer at all (frozen layers below the first trainable
    parameter keep nothing)."""
    return trainable or grad_in or setup.method in ("lora", "qlora")


@dataclass(frozen=True)
class _Copies:
    """Compute-dtype weight copies made by autocast for one decoder layer and the LM head.

    Autocast casts a linear's weight on every use and the matmul keeps the copy for
    backward; weights already in the compute dtype (or quantized) need none. Casts of
    weights that require grad are also cached by autocast until the forward ends, which
    matters under gradient checkpointing, where nothing else keeps them.
    """

    saved: int  # per layer, kept for backward
    cached: int  # per layer, the part autocast caches (trainable leaves)
    head: int


def _weight_copies(arch: Architecture, setup: TrainSetup, trainable: bool, layer: int = 0) -> _Copies:
    p = precision(setup)
    if not p.autocast:
        return _Copies(0, 0, 0)
    e = p.compute
    linear = sum(lin.in_features * lin.out_features for lin in arch.linears())
    base = 0
    if setup.method != "qlora" and layer_weight_bytes(setup, trainable) != e:
        base = e * linear
    adapters = e * lora_params_per_layer(arch, setup, layer) if p.adapter != e else 0
    head_dtype = setup.trainable_dtype if setup.method == "full" else setup.frozen_weights_dtype
    head = e * arch.vocab_size * arch.hidden_size if DTYPE_BYTES[head_dtype] != e else 0
    return _Copies(saved=base + adapters, cached=(base if trainable else 0) + adapters, head=head)


def estimate_peak(arch: Architecture, setup: TrainSetup) -> MemoryEstimate:
    """Estimate the peak memory of one device for one steady-state training step.

    Args:
        arch: the model architecture (from :func:`steadytune.estimate.arch.load_architecture`).
        setup: how it trains.

    Returns:
        The peak, its breakdown by component (summing to the peak) and the moment of the
        step where it happens.
    """
    tokens = setup.batch * setup.seq
    counts = param_counts(arch, setup)
    ms = model_states(arch, setup)
    e = precision(setup).compute
    k = _kept(arch, setup, tokens)
    head = k.head
    log_probs = head.log_softmax * tokens
    saved = k.layer_acts + (head.saved - head.log_softmax) * tokens
    fwd_scratch, bwd_scratch, step_scratch = _scratch(arch, setup, counts, ms, tokens, k.residual)
    persistent = {
        "weights": ms.weights + ms.sharded_gather,
        "adapters": ms.adapters,
        "quantization_constants": ms.quantization_constants,
        "optimizer_states": ms.optimizer_states,
    }
    accumulated, head_grads, bottom_grads = _gradient_sizes(arch, setup, counts, ms)

    def moment(copies: float, grads: float, acts: float, logits: float, temp: float) -> dict[str, int]:
        out = dict(persistent)
        out["weights"] += int(copies)
        out["gradients"] = int(grads)
        out["activations"] = int(acts)
        out["logits_loss"] = int(logits)
        out["temporaries"] = int(temp)
        return out

    moments = {
        # End of forward: logits, their fp32 upcast and the log-probabilities coexist.
        "forward": moment(k.copies_forward, accumulated, saved, log_probs + head.forward_extra * tokens, 0),
        # Inside the last layer's forward: its unsaved intermediates.
        "forward_layer": moment(k.copies_forward, accumulated, saved, 0, fwd_scratch),
        # Start of backward: cross-entropy's dense gradients next to the log-probabilities.
        "loss": moment(k.copies_backward, accumulated, saved, log_probs + head.backward_extra * tokens, 0),
        # LM head backward: the compute-dtype logits gradient, the head's weight gradient.
        "lm_head": moment(
            k.copies_backward,
            max(accumulated, head_grads),
            saved,
            e * arch.vocab_size * tokens,
            ms.weight_grad_scratch,
        ),
        # Top decoder layer backward (recomputed first under checkpointing).
        "top": moment(
            k.copies_backward + k.recompute_copies,
            max(accumulated, head_grads),
            k.layer_acts + k.recompute,
            0,
            bwd_scratch,
        ),
        # Bottom decoder layer backward: nearly all gradients, one layer's activations.
        "bottom": moment(
            k.recompute_copies if setup.gradient_checkpointing else k.copy_layer,
            max(accumulated, bottom_grads),
            k.bottom_layer + head.inputs * tokens,
            0,
            bwd_scratch,
        ),
        "optimizer": moment(0, ms.gradients, 0, 0, step_scratch),
    }
    phases = {name: sum(parts.values()) for name, parts in moments.items()}
    phase = max(phases, key=lambda name: phases[name])
    breakdown = _breakdown(moments[phase], phases[phase], setup)
    return MemoryEstimate(sum(breakdown.values()), breakdown, phase, phases, k.detail(tokens), counts)


@dataclass(frozen=True)
class _Kept:
    """What the forward keeps for backward, in bytes for the step's tokens, with or without
    gradient checkpointing (then each layer keeps only its input, and the layer in backward is
    recomputed whole, with its weight copies)."""

    layers: list[tuple[LayerActivations, _Copies]]  # of each layer autograd records
    head: HeadActivations
    checkpointed: bool
    layer_acts: float  # every layer's saved activations (checkpointed: their inputs)
    copies_forward: int  # the compute-dtype weight copies alive at the end of forward
    copies_backward: int  # and in backward
    recompute: float  # the recomputed layer's activations (0 without checkpointing)
    recompute_copies: int  # and its weight copies
    copy_layer: int  # the largest layer's weight copies
    bottom_layer: float  # what the bottom layer's backward holds of activations
    residual: float  # the residual stream of the step's tokens

    def detail(self, tokens: int) -> dict[str, int]:
        """Saved-for-backward bytes over the whole forward, by where they come from."""
        layers, head = self.layers, self.head
        return {
            "attention": int(sum(a.attention for a, _ in layers) * tokens),
            "mlp": int(sum(a.mlp for a, _ in layers) * tokens),
            "norms": int(sum(a.norms for a, _ in layers) * tokens),
            "head": int((head.saved - head.log_softmax) * tokens),
            "logits_loss": int((head.log_softmax + max(head.forward_extra, head.backward_extra)) * tokens),
            "checkpointed": int(self.layer_acts) if self.checkpointed else 0,
        }


def _kept(arch: Architecture, setup: TrainSetup, tokens: int) -> _Kept:
    layers = _recorded_layers(arch, setup)
    copy_head = _weight_copies(arch, setup, setup.method == "full").head
    full_layer = max((a.total for a, _ in layers), default=0.0) * tokens
    copy_layer = max((c.saved for _, c in layers), default=0)
    residual = precision(setup).residual * arch.hidden_size * tokens
    ckpt = setup.gradient_checkpointing
    if ckpt:
        layer_acts = len(layers) * checkpointed_layer_bytes(arch, setup) * tokens
        copies_backward = copy_head
        copies_forward = copy_head + sum(c.cached for _, c in layers)
        recompute, recompute_copies = full_layer, copy_layer
    else:
        layer_acts = sum(a.total for a, _ in layers) * tokens
        copies_backward = copies_forward = copy_head + sum(c.saved for _, c in layers)
        recompute, recompute_copies = 0.0, 0
    bottom_layer = (full_layer if layers else 0) + (residual if ckpt else 0)
    return _Kept(
        layers,
        head_activations(arch, setup),
        ckpt,
        layer_acts,
        copies_forward,
        copies_backward,
        recompute,
        recompute_copies,
        copy_layer,
        bottom_layer,
        residual,
    )


def _recorded_layers(arch: Architecture, setup: TrainSetup) -> list[tuple[LayerActivations, _Copies]]:
    """The activations per token and the weight copies of each decoder layer autograd records."""
    out = []
    for i, (trainable, grad_in) in enumerate(_layer_plan(arch, setup)):
        if _in_grad_region(setup, trainable, grad_in):
            acts = layer_activations(arch, setup, trainable, grad_in)
            out.append((acts, _weight_copies(arch, setup, trainable, i)))
    return out


def _gradient_sizes(
    arch: Architecture, setup: TrainSetup, counts: ParamCounts, ms: ModelStates
) -> tuple[int, int, int]:
    """Gradient bytes alive: those accumulated over micro-batches (all of them, or none), after the
    LM head's backward, and when the bottom layer's backward starts."""
    accumulated = ms.gradients if setup.gradient_accumulation_steps > 1 else 0
    head = _head_gradient_bytes(arch, setup, counts, ms.gradients)
    bottom = ms.gradients - _layer_gradient_bytes(arch, setup, counts, ms.gradients)
    if setup.method == "full":
        bottom -= head if arch.tie_word_embeddings else _embedding_gradient_bytes(arch, counts, ms.gradients)
    return accumulated, head, bottom


def _breakdown(parts: dict[str, int], tensor_peak: int, setup: TrainSetup) -> dict[str, int]:
    """The peak moment's bytes by component, with what CUDA adds beyond the tensors."""
    out = {name: parts.get(name, 0) for name in COMPONENTS[:-2]}
    on_cuda = setup.device == "cuda"
    out["cuda_context"] = setup.cuda_context_bytes if on_cuda else 0
    out["allocator_margin"] = int(tensor_peak * setup.allocator_margin) if on_cuda else 0
    return out


def _scratch(
    arch: Architecture, setup: TrainSetup, counts: ParamCounts, ms: ModelStates, tokens: int, residual: float
) -> tuple[float, float, int]:
    """Scratch inside one op, in forward, backward and the optimizer step.

    The MLP's unsaved intermediates in forward and the gradients of its intermediates in
    backward (plus the residual stream's gradient), a 4-bit weight dequantized for one
    matmul, the compute-dtype weight gradient before its cast to fp32, Adafactor's
    per-tensor update buffers.
    """
    e = precision(setup).compute
    mlp_width = e * arch.intermediate_size * tokens
    dequant = e * arch.largest_linear_params if setup.method == "qlora" else 0
    fwd = 2 * mlp_width + dequant
    layer_grad_scratch = min(ms.weight_grad_scratch, e * arch.largest_linear_params)
    bwd = 2 * mlp_width + 2 * residual + layer_grad_scratch + dequant
    step = 0
    if setup.optimizer == "adafactor":
        step = 3 * 4 * counts.largest_trainable_tensor
    elif setup.optimizer == "adamw8bit" and setup.device == "cpu":
        # bitsandbytes' CPU path dequantizes both states and updates in fp32, one tensor at
        # a time (measured: 20 bytes per element, 24 for bf16 params); its CUDA kernel is fused.
        step = (20 if DTYPE_BYTES[setup.trainable_dtype] == 4 else 24) * counts.largest_trainable_tensor
    return fwd, bwd, step


def _embedding_gradient_bytes(arch: Architecture, counts: ParamCounts, gradients: int) -> int:
    """Gradient of an untied input embedding, allocated last in backward."""
    return int(gradients * arch.embedding_params / counts.trainable) if counts.trainable else 0


def _head_gradient_bytes(arch: Architecture, setup: TrainSetup, counts: ParamCounts, gradients: int) -> int:
    """Gradients allocated by the LM head's backward (full fine-tuning only)."""
    if setup.method != "full" or counts.trainable == 0:
        return 0
    share = arch.vocab_size * arch.hidden_size / counts.trainable
    return int(gradients * share)


def _layer_gradient_bytes(arch: Architecture, setup: TrainSetup, counts: ParamCounts, gradients: int) -> int:
    """Gradients of the top decoder layer, allocated as its backward runs."""
    if counts.trainable == 0:
        return 0
    if setup.method == "full":
        share = arch.layer_params / counts.trainable
    elif setup.method == "freeze":
        share = 1 / min(setup.freeze_trainable_layers, arch.num_layers)
    else:
        share = 1 / arch.num_layers
    return int(gradients * share)

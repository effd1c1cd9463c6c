"""How a run trains, as flat fields: what the estimator needs beyond the architecture."""

from __future__ import annotations

import re
from dataclasses import dataclass

from steadytune.estimate.arch import LINEAR_MODULES

METHODS = ("full", "lora", "qlora", "freeze")
DTYPES = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "adamw8bit", "sgd", "adafactor")
ATTENTIONS = ("sdpa", "eager", "flash")
DEVICES = ("cuda", "cpu")

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}

# Names people use for the same dtype, mapped to ours.
DTYPE_ALIASES: dict[str, str] = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "32": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "16": "bf16",
}

# What an 80 GB-class GPU loses to the CUDA context and kernels before the first tensor
# (the transformers "model memory anatomy" guide measured 1343 MB on a V100 with eager
# loading; CUDA >= 11.7 loads kernels lazily and H100/A100 contexts are ~0.5 GiB).
DEFAULT_CUDA_CONTEXT_BYTES = 512 * 1024**2
# The caching allocator rounds blocks and fragments; reserved runs a few % above allocated.
DEFAULT_ALLOCATOR_MARGIN = 0.05


class SetupError(ValueError):
    """A training setup that cannot be estimated; the message lists every problem."""


def normalize_dtype(value: str) -> str:
    """Map ``"bfloat16"``/``"torch.bfloat16"``/``"bf16"`` to ``"bf16"`` (and so on)."""
    key = str(value).lower().removeprefix("torch.")
    if key not in DTYPE_ALIASES:
        raise SetupError(f"unknown dtype {value!r}; use one of {', '.join(DTYPES)}")
    return DTYPE_ALIASES[key]


def expand_target_modules(target_modules: tuple[str, ...]) -> tuple[str, ...]:
    """Resolve PEFT's ``"all-linear"`` into the per-layer projections it selects."""
    if any(t in ("all-linear", "all_linear", "all") for t in target_modules):
        return LINEAR_MODULES
    return tuple(t for t in LINEAR_MODULES if t in target_modules)


@dataclass(frozen=True)
class TrainSetup:
    """One training configuration, flat, as the estimator and its callers share it.

    Attributes:
        method: ``full``, ``lora``, ``qlora`` (4-bit NF4 base + LoRA) or ``freeze``
            (only the last ``freeze_trainable_layers`` decoder layers train).
        lora_r: LoRA rank (PEFT ``r``).
        lora_rank_pattern: PEFT ``rank_pattern`` as ``(regex, rank)`` pairs; the first key
            that ends a module's name sets its rank, the others keep ``lora_r``.
        lora_dropout: PEFT ``lora_dropout``; above 0 every adapted projection keeps a
            dropped copy of its input and a mask for backward.
        target_modules: PEFT ``target_modules``; ``("all-linear",)`` selects all seven.
        dtype: the compute dtype: ``fp32``, ``bf16`` or ``fp16``.
        mixed_precision: True is HF Trainer ``bf16=True``/``fp16=True`` (autocast, trainable
            weights, their gradients and optimizer states in fp32); False is "pure"
            precision (everything in ``dtype``, LLaMA-Factory ``pure_bf16``).
        weights_dtype: the dtype the frozen base weights are loaded in; None means
            ``dtype`` (and fp32 for full mixed-precision training). litgpt's
            ``bf16-mixed`` LoRA keeps them in fp32.
        optimizer: ``adamw`` (fused torch AdamW, the HF default), ``adamw8bit``
            (bitsandbytes), ``sgd`` (no momentum, the torch default) or ``adafactor``.
        batch: micro-batch size per device.
        seq: tokens per sample (padded or packed length).
        gradient_accumulation_steps: above 1, gradients stay alive through the forward and
            backward of the next micro-batches.
        gradient_checkpointing: recompute each decoder layer in backward (HF, non-reentrant).
        attn: ``sdpa`` and ``flash`` keep O(seq) attention state; ``eager`` keeps the
            (heads x seq x seq) probabilities.
        zero_stage: DeepSpeed ZeRO stage 0-3 (1: optimizer states, 2: + gradients,
            3: + weights are sharded over ``gpus``).
        fsdp: FSDP FULL_SHARD (like stage 3 with fp32 sharded params in mixed precision).
        gpus: data-parallel devices that share the sharded states.
        quant_bits: bits of the quantized base weights for ``qlora`` (4 or 8).
        double_quant: bitsandbytes ``bnb_4bit_use_double_quant``.
        freeze_trainable_layers: trainable decoder layers for ``method="freeze"``.
        device: ``cuda`` adds the CUDA context and an allocator margin; ``cpu`` does not.
        cuda_context_bytes: memory the CUDA context takes before any tensor.
        allocator_margin: fraction of the tensor peak added for caching-allocator
            fragmentation.
    """

    method: str = "lora"
    lora_r: int = 8
    lora_rank_pattern: tuple[tuple[str, int], ...] = ()
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    dtype: str = "bf16"
    mixed_precision: bool = True
    weights_dtype: str | None = None
    optimizer: str = "adamw"
    batch: int = 1
    seq: int = 2048
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = False
    attn: str = "sdpa"
    zero_stage: int = 0
    fsdp: bool = False
    gpus: int = 1
    quant_bits: int = 4
    double_quant: bool = True
    freeze_trainable_layers: int = 2
    device: str = "cuda"
    cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT_BYTES
    allocator_margin: float = DEFAULT_ALLOCATOR_MARGIN

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise SetupError("invalid training setup: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every problem with this setup, each with the offending value and the fix."""
        out: list[str] = []

        def one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
            if value not in allowed:
                out.append(f"{name}={value!r} is not one of {', '.join(allowed)}")

        one_of("method", self.method, METHODS)
        one_of("dtype", self.dtype, DTYPES)
        if self.weights_dtype is not None:
            one_of("weights_dtype", self.weights_dtype, DTYPES)
        one_of("optimizer", self.optimizer, OPTIMIZERS)
        one_of("attn", self.attn, ATTENTIONS)
        one_of("device", self.device, DEVICES)
        for name in ("batch", "seq", "gpus", "lora_r", "gradient_accumulation_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                out.append(f"{name}={value!r} must be a positive integer")
        if self.zero_stage not in (0, 1, 2, 3):
            out.append(f"zero_stage={self.zero_stage!r} must be 0, 1, 2 or 3")
        if self.fsdp and self.zero_stage:
            out.append("fsdp and zero_stage are alternatives; set only one of them")
        if self.quant_bits not in (4, 8):
            out.append(f"quant_bits={self.quant_bits!r} must be 4 or 8")
        if self.method in ("lora", "qlora") and not expand_target_modules(self.target_modules):
            out.append(
                f"target_modules={list(self.target_modules)!r} selects no projection; use names "
                f"from {', '.join(LINEAR_MODULES)} or 'all-linear'"
            )
        for key, rank in self.lora_rank_pattern:
            if not isinstance(rank, int) or rank < 1:
                out.append(f"lora_rank_pattern[{key!r}]={rank!r} must be a positive integer")
            try:
                re.compile(key)
            except re.error as exc:
                out.append(f"lora_rank_pattern key {key!r} is not a valid regex ({exc})")
        if self.freeze_trainable_layers < 1:
            out.append(f"freeze_trainable_layers={self.freeze_trainable_layers!r} must be >= 1")
        if not 0 <= self.lora_dropout < 1:
            out.append(f"lora_dropout={self.lora_dropout!r} must be in [0, 1)")
        if not 0 <= self.allocator_margin < 1:
            out.append(f"allocator_margin={self.allocator_margin!r} must be in [0, 1)")
        return out

    @property
    def max_lora_r(self) -> int:
        """The largest rank any adapted module gets."""
        return max([self.lora_r, *(rank for _, rank in self.lora_rank_pattern)])

    @property
    def compute_bytes(self) -> int:
        """Bytes per element of activations."""
        return DTYPE_BYTES[self.dtype]

    @property
    def frozen_weights_dtype(self) -> str:
        if self.weights_dtype is not None:
            return self.weights_dtype
        if self.method == "full" and self.mixed_precision:
            return "fp32"
        return self.dtype

    @property
    def trainable_dtype(self) -> str:
        """dtype of trainable weights, their gradients and their optimizer states."""
        return "fp32" if self.mixed_precision else self.dtype

    @property
    def lora_modules(self) -> tuple[str, ...]:
        return expand_target_modules(self.target_modules) if self.method in ("lora", "qlora") else ()

    @property
    def shards(self) -> int:
        """How many ways the sharded states are split."""
        return self.gpus if (self.zero_stage or self.fsdp) else 1

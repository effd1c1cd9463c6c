"""Model states: weights, adapters, quantization constants, gradients, optimizer states.

Everything here is a count of parameters times bytes per parameter; sharding (ZeRO,
FSDP) divides some of it by the number of devices. Pure functions of the architecture
and the setup.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from steadytune.estimate.arch import Architecture
from steadytune.estimate.setup import DTYPE_BYTES, TrainSetup
from steadytune.layerwise import rank_of

# bitsandbytes keeps tensors below this many elements in fp32 optimizer state.
_BNB_MIN_8BIT_SIZE = 4096
# bitsandbytes block-wise quantization: one fp32 absmax per 256 values per state.
_BNB_OPTIM_BLOCK = 256
# NF4 quantizes blocks of 64 weights; double quantization stores each block's absmax in
# 8 bits with one fp32 absmax per 256 blocks.
_NF4_BLOCK = 64
_NF4_DQ_BLOCK = 256


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by role."""

    total: int  # base model
    trainable: int  # what the optimizer updates (LoRA params for lora/qlora)
    adapter: int  # LoRA params (0 without LoRA)
    quantized: int  # base params stored quantized (qlora)
    largest_trainable_tensor: int
    trainable_matrices: tuple[tuple[int, int, int], ...]  # (rows, cols, count) for Adafactor


def lora_rank(arch: Architecture, setup: TrainSetup, layer: int, module: str) -> int:
    """The rank PEFT gives ``module`` of decoder layer ``layer`` (``lora_rank_pattern`` first)."""
    if not setup.lora_rank_pattern:
        return setup.lora_r
    return rank_of(arch.module_name(layer, module), setup.lora_r, dict(setup.lora_rank_pattern))


def lora_params_per_layer(arch: Architecture, setup: TrainSetup, layer: int = 0) -> int:
    modules = set(setup.lora_modules)
    return sum(
        lora_rank(arch, setup, layer, lin.name) * (lin.in_features + lin.out_features)
        for lin in arch.linears()
        if lin.name in modules
    )


def param_counts(arch: Architecture, setup: TrainSetup) -> ParamCounts:
    """Count base, trainable, adapter and quantized parameters for ``setup``."""
    linears = arch.linears()
    quantized = arch.num_layers * sum(lin.in_features * lin.out_features for lin in linears)
    if setup.method == "full":
        head = arch.embedding_params if arch.tie_word_embeddings else arch.lm_head_params
        matrices = [(lin.out_features, lin.in_features, arch.num_layers) for lin in linears]
        matrices.append((arch.vocab_size, arch.hidden_size, 1 if arch.tie_word_embeddings else 2))
        return ParamCounts(
            total=arch.total_params,
            trainable=arch.total_params,
            adapter=0,
            quantized=0,
            largest_trainable_tensor=max(head, arch.largest_linear_params),
            trainable_matrices=tuple(matrices),
        )
    if setup.method == "freeze":
        n = min(setup.freeze_trainable_layers, arch.num_layers)
        return ParamCounts(
            total=arch.total_params,
            trainable=n * arch.layer_params,
            adapter=0,
            quantized=0,
            largest_trainable_tensor=arch.largest_linear_params,
            trainable_matrices=tuple((lin.out_features, lin.in_features, n) for lin in linears),
        )
    adapter = sum(lora_params_per_layer(arch, setup, i) for i in range(arch.num_layers))
    modules = set(setup.lora_modules)
    shapes: Counter[tuple[int, int]] = Counter()  # (rows, cols) of every A and B matrix
    for i in range(arch.num_layers):
        for lin in linears:
            if lin.name in modules:
                r = lora_rank(arch, setup, i, lin.name)
                shapes[(r, lin.in_features)] += 1
                shapes[(lin.out_features, r)] += 1
    matrices = [(rows, cols, n) for (rows, cols), n in shapes.items()]
    largest = max(r * c for r, c, _ in matrices)
    return ParamCounts(
        total=arch.total_params,
        trainable=adapter,
        adapter=adapter,
        quantized=quantized if setup.method == "qlora" else 0,
        largest_trainable_tensor=largest,
        trainable_matrices=tuple(matrices),
    )


@dataclass(frozen=True)
class ModelStates:
    """Per-device bytes of everything that lives across steps (plus gradients)."""

    weights: int
    adapters: int
    quantization_constants: int
    gradients: int  # all gradients alive at the end of backward
    optimizer_states: int
    weight_grad_scratch: int  # compute-dtype weight gradient before its fp32 cast
    sharded_gather: int  # one gathered unit under ZeRO-3/FSDP


def _quantized_bytes(params: int, setup: TrainSetup) -> tuple[int, int]:
    """(data, constants) bytes of the quantized base linears."""
    if setup.quant_bits == 8:
        # LLM.int8: int8 weights and one fp32 scale per output row (~1 per 4096 weights).
        return params, params * 4 // 4096
    data = params // 2
    if setup.double_quant:
        blocks = params // _NF4_BLOCK
        constants = blocks + 4 * (blocks // _NF4_DQ_BLOCK + 1)
    else:
        constants = 4 * (params // _NF4_BLOCK)
    return data, constants


def optimizer_state_bytes(counts: ParamCounts, setup: TrainSetup) -> int:
    """Bytes of optimizer state for the trainable parameters (unsharded)."""
    s = DTYPE_BYTES[setup.trainable_dtype]
    n = counts.trainable
    if setup.optimizer == "adamw":
        return 2 * s * n
    if setup.optimizer == "sgd":
        return 0  # torch SGD without momentum (the HF ``sgd`` choice) keeps no state
    if setup.optimizer == "adamw8bit":
        large = sum(r * c * k for r, c, k in counts.trainable_matrices if r * c >= _BNB_MIN_8BIT_SIZE)
        small = n - large
        return int(2 * large * (1 + 4 / _BNB_OPTIM_BLOCK)) + 8 * small
    # Adafactor (HF, beta1=None): row and column second-moment factors per matrix,
    # a full second moment for vectors.
    matrices = sum((r + c) * k for r, c, k in counts.trainable_matrices)
    in_matrices = sum(r * c * k for r, c, k in counts.trainable_matrices)
    return s * (matrices + max(0, n - in_matrices))


def model_states(arch: Architecture, setup: TrainSetup) -> ModelStates:
    """Weights, adapters, quantization constants, gradients and optimizer states per device."""
    counts = param_counts(arch, setup)
    frozen = DTYPE_BYTES[setup.frozen_weights_dtype]
    trainable = DTYPE_BYTES[setup.trainable_dtype]
    e = setup.compute_bytes
    shards = setup.shards
    constants = 0
    adapters = 0
    if setup.method == "full":
        weights = trainable * counts.total
    elif setup.method == "freeze":
        weights = trainable * counts.trainable + frozen * (counts.total - counts.trainable)
    else:
        adapters = (4 if setup.mixed_precision else e) * counts.adapter
        if setup.method == "qlora":
            data, constants = _quantized_bytes(counts.quantized, setup)
            weights = data + frozen * (counts.total - counts.quantized)
        else:
            weights = frozen * counts.total
    grad_bytes = 4 if (setup.method in ("lora", "qlora") and setup.mixed_precision) else trainable
    gradients = grad_bytes * counts.trainable
    states = optimizer_state_bytes(counts, setup)
    # Autocast computes weight gradients in the compute dtype, then casts them to fp32.
    scratch = e * counts.largest_trainable_tensor if grad_bytes != e else 0
    gather = 0

    # Under DeepSpeed or FSDP the precision scheme changes even on one device (bf16 model,
    # fp32 master copy in the optimizer), so their formulas apply for any device count.
    if setup.zero_stage:
        return _deepspeed(arch, setup, counts, weights, adapters, constants, gradients, states, scratch)
    if setup.fsdp:
        # FSDP FULL_SHARD keeps every state sharded in its own dtype. The root unit (embedding,
        # LM head) stays gathered through forward and backward; each decoder layer is gathered
        # in the compute dtype, with the next one prefetched.
        head = arch.embedding_params + arch.lm_head_params
        gather = e * head + 2 * e * arch.layer_params
        return ModelStates(
            weights // shards,
            adapters // shards,
            constants // shards,
            gradients // shards,
            states // shards,
            scratch,
            gather,
        )
    if setup.gpus > 1:
        # DDP (gradient_as_bucket_view=False, the default) copies gradients into its buckets.
        gradients *= 2
    return ModelStates(weights, adapters, constants, gradients, states, scratch, 0)


def _deepspeed(
    arch: Architecture,
    setup: TrainSetup,
    counts: ParamCounts,
    weights: int,
    adapters: int,
    constants: int,
    gradients: int,
    states: int,
    scratch: int,
) -> ModelStates:
    """DeepSpeed ZeRO per-device model states, following DeepSpeed's own estimator.

    Stage 1/2: compute-dtype weights and gradients stay whole on every device; the fp32
    master weights, fp32 gradient partition and optimizer states are sharded
    (4 + 16/N bytes per parameter for mixed-precision AdamW). Stage 3 shards all of it
    (18/N) and gathers the largest module's weights and gradients (4 bytes per parameter
    of that module).
    """
    n = counts.trainable
    shards = setup.shards
    e = setup.compute_bytes
    mixed = setup.mixed_precision and setup.dtype != "fp32"
    low = e if mixed else DTYPE_BYTES[setup.trainable_dtype]
    trainable_weights = adapters if counts.adapter else low * n
    frozen_weights = weights - (0 if counts.adapter else DTYPE_BYTES[setup.trainable_dtype] * n)
    master = 4 * n if mixed else 0  # DeepSpeed's fp32 master copy, owned by its optimizer
    fp32_grads = 4 * n if mixed else 0
    sharded_states = (master + states) // shards
    sharded_grads = fp32_grads // shards
    if setup.zero_stage == 3:
        largest = max(arch.embedding_params, arch.largest_linear_params)
        return ModelStates(
            frozen_weights // shards + (0 if counts.adapter else trainable_weights // shards),
            trainable_weights // shards if counts.adapter else 0,
            constants // shards,
            sharded_grads,
            sharded_states,
            scratch,
            2 * e * largest,
        )
    return ModelStates(
        frozen_weights + (0 if counts.adapter else trainable_weights),
        trainable_weights if counts.adapter else 0,
        constants,
        low * n + sharded_grads,
        sharded_states,
        scratch,
        0,
    )

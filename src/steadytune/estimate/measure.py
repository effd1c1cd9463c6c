"""Measured mode: build the configured model with random weights and train it for real.

This is the only module of :mod:`steadytune.estimate` that touches torch; everything is
imported lazily so ``steadytune estimate`` stays fast without ``--measure``.

The training step mirrors what the HF Trainer does for the same settings: ``model(**batch,
labels=...)`` under autocast when precision is mixed, the outputs dropped before
``loss.backward()``, the optimizer step, then ``zero_grad(set_to_none=True)``. We run two
steps by default because optimizer states are created lazily in the first ``step()``; only
from the second step on do they coexist with the activations, which is the steady state
the estimate describes.

How the peak is measured:

* CUDA: ``torch.cuda.max_memory_allocated`` (reset before the run), i.e. live tensor
  bytes as the caching allocator sees them, without the CUDA context and without the
  allocator's cached-but-free blocks.
* CPU: torch has no allocator statistics for host memory, so we run the whole thing
  (model construction included) under ``torch.profiler.profile(profile_memory=True)``.
  The profiler receives one event per allocation and free from c10's CPU allocator,
  including the scratch buffers that kernels allocate internally and that a
  ``TorchDispatchMode`` tracker cannot see. Summing the signed sizes in time order gives
  the live bytes at every moment; the peak after the model is built is what
  ``max_memory_allocated`` would report on a GPU. Allocations that do not go through c10
  (Python objects, NumPy) are not counted, and neither are any on the device.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from steadytune.estimate.arch import Architecture
from steadytune.estimate.setup import TrainSetup

_PHASES = ("forward", "backward", "optimizer")


class MeasureError(RuntimeError):
    """The measured run could not be set up (missing extra, unsupported combination)."""


@dataclass(frozen=True)
class MeasuredPeak:
    """What one measured run found.

    Attributes:
        peak_bytes: the highest live tensor bytes during training (model already built).
        baseline_bytes: live tensor bytes when training began (weights, buffers).
        phase_peaks: the peak inside each phase (forward, backward, optimizer).
        device: ``cpu`` or ``cuda``.
        how: the measuring instrument, in words.
        seconds: wall time of the training steps.
    """

    peak_bytes: int
    baseline_bytes: int
    phase_peaks: dict[str, int] = field(default_factory=dict)
    device: str = "cpu"
    how: str = ""
    seconds: float = 0.0


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MeasureError("--measure needs torch; install steadytune[train]") from exc
    return torch


_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def hf_config(arch: Architecture) -> Any:
    """A transformers config object for ``arch`` (random init, no download)."""
    from transformers import AutoConfig

    model_type = arch.model_type if arch.model_type in ("llama", "mistral", "qwen2", "qwen3") else "llama"
    kwargs: dict[str, Any] = dict(
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        vocab_size=arch.vocab_size,
        tie_word_embeddings=arch.tie_word_embeddings,
        max_position_embeddings=arch.max_position_embeddings,
        hidden_act=arch.hidden_act,
        use_cache=False,
    )
    if model_type == "llama":
        kwargs.update(attention_bias=arch.attention_bias, mlp_bias=arch.mlp_bias)
    return AutoConfig.for_model(model_type, **kwargs)


def _quantize_linears(model: Any, setup: TrainSetup, torch: Any) -> None:
    """Swap every decoder-layer ``nn.Linear`` for a bitsandbytes 4-bit/8-bit layer.

    The lm_head and embeddings stay in ``dtype``, as transformers' bitsandbytes
    integration leaves them.
    """
    try:
        import bitsandbytes as bnb
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MeasureError("qlora measurement needs bitsandbytes; install steadytune[train]") from exc
    compute = getattr(torch, _TORCH_DTYPES[setup.dtype])
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if not isinstance(child, torch.nn.Linear):
                    continue
                new: torch.nn.Module
                if setup.quant_bits == 4:
                    new = bnb.nn.Linear4bit(
                        child.in_features,
                        child.out_features,
                        bias=child.bias is not None,
                        compute_dtype=compute,
                        compress_statistics=setup.double_quant,
                        quant_type="nf4",
                    )
                    new.weight = bnb.nn.Params4bit(
                        child.weight.data.to("cpu"),
                        requires_grad=False,
                        compress_statistics=setup.double_quant,
                        quant_type="nf4",
                    )
                else:
                    new = bnb.nn.Linear8bitLt(
                        child.in_features,
                        child.out_features,
                        bias=child.bias is not None,
                        has_fp16_weights=False,
                    )
                    new.weight = bnb.nn.Int8Params(child.weight.data.to("cpu"), requires_grad=False)
                if child.bias is not None:
                    new.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                setattr(parent, name, new)
                del child
    device = next(model.parameters()).device
    model.to(device)  # Params4bit/Int8Params quantize when moved to a real device


def build_model(arch: Architecture, setup: TrainSetup, device: str = "cpu", seed: int = 0) -> Any:
    """Instantiate the configured model with random weights, ready to train.

    Args:
        arch: the architecture.
        setup: method, dtype, LoRA and precision settings (sharding is ignored: one device).
        device: ``cpu`` or ``cuda``.
        seed: seed for the random init.

    Returns:
        The model (a ``PeftModel`` for lora/qlora), in train mode.
    """
    torch = _torch()
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = hf_config(arch)
    attn = {"flash": "flash_attention_2"}.get(setup.attn, setup.attn)
    config._attn_implementation = attn
    load_dtype = getattr(torch, _TORCH_DTYPES[setup.frozen_weights_dtype])
    model = AutoModelForCausalLM.from_config(config, dtype=load_dtype, attn_implementation=attn)
    model.to(device)
    if setup.method == "qlora":
        _quantize_linears(model, setup, torch)
    if setup.gradient_checkpointing:
        # transformers 5 renamed gradient checkpointing to activation checkpointing.
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable({"use_reentrant": False})
        else:  # pragma: no cover - transformers 4.x
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if setup.method in ("lora", "qlora"):
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MeasureError("lora measurement needs peft; install steadytune[train]") from exc
        lora = LoraConfig(
            r=setup.lora_r,
            lora_alpha=2 * setup.lora_r,
            lora_dropout=setup.lora_dropout,
            target_modules=list(setup.lora_modules),
            rank_pattern=dict(setup.lora_rank_pattern),
            task_type="CAUSAL_LM",
        )
        # PEFT upcasts bf16/fp16 adapters to fp32 unless asked not to: that is mixed precision.
        with warnings.catch_warnings():
            # PEFT still calls transformers' deprecated is_gradient_checkpointing.
            warnings.simplefilter("ignore", FutureWarning)
            model = get_peft_model(model, lora, autocast_adapter_dtype=setup.mixed_precision)
    elif setup.method == "freeze":
        model.requires_grad_(False)
        for layer in model.model.layers[-setup.freeze_trainable_layers :]:
            layer.requires_grad_(True)
            if setup.mixed_precision:
                layer.to(torch.float32)  # trainable weights are the fp32 master copy
    elif setup.method == "full" and setup.mixed_precision:
        model.to(torch.float32)
    model.train()
    return model


def build_optimizer(params: list[Any], setup: TrainSetup) -> Any:
    """The optimizer the setup names, over ``params``."""
    torch = _torch()
    if setup.optimizer == "adamw":
        # The HF Trainer default on torch >= 2.8 is adamw_torch_fused: no foreach scratch copies.
        return torch.optim.AdamW(params, lr=1e-5, fused=True)
    if setup.optimizer == "adamw8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=1e-5)
    if setup.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-5)
    from transformers.optimization import Adafactor

    return Adafactor(params, lr=1e-5, scale_parameter=False, relative_step=False, warmup_init=False)


def _train_steps(model: Any, setup: TrainSetup, device: str, steps: int, mark: Any) -> None:
    torch = _torch()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, setup)
    vocab = model.config.vocab_size if hasattr(model, "config") else 32000
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (setup.batch, setup.seq), generator=generator).to(device)
    dtype = getattr(torch, _TORCH_DTYPES[setup.dtype])
    autocast = setup.mixed_precision and setup.dtype != "fp32"
    for _ in range(steps):
        with mark("forward"):
            ctx = torch.autocast(device, dtype=dtype) if autocast else contextlib.nullcontext()
            with ctx:
                loss = model(input_ids=ids, labels=ids).loss
        with mark("backward"):
            loss.backward()
            del loss
        with mark("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def pick_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu``."""
    return "cuda" if _torch().cuda.is_available() else "cpu"


def measure_peak(
    arch: Architecture, setup: TrainSetup, device: str | None = None, steps: int = 2
) -> MeasuredPeak:
    """Train the configured model for ``steps`` optimizer steps and report the peak memory.

    Args:
        arch: the architecture (kept small on CPU: it really runs).
        setup: the training setup (one device; ZeRO/FSDP sharding is not simulated).
        device: ``cuda`` or ``cpu``; None picks CUDA when available.
        steps: optimizer steps; 2 or more reaches the steady state.

    Returns:
        The measured peak, the baseline and the per-phase peaks.
    """
    if device is None:
        device = pick_device()
    if device == "cuda":
        return _measure_cuda(arch, setup, steps)
    return _measure_cpu(arch, setup, steps)


def _measure_cuda(arch: Architecture, setup: TrainSetup, steps: int) -> MeasuredPeak:
    torch = _torch()
    model = build_model(arch, setup, device="cuda")
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    phase_peaks: dict[str, int] = dict.fromkeys(_PHASES, 0)

    @contextlib.contextmanager
    def mark(name: str) -> Iterator[None]:
        torch.cuda.reset_peak_memory_stats()
        yield
        torch.cuda.synchronize()
        phase_peaks[name] = max(phase_peaks[name], torch.cuda.max_memory_allocated())

    start = time.perf_counter()
    _train_steps(model, setup, "cuda", steps, mark)
    seconds = time.perf_counter() - start
    return MeasuredPeak(
        peak_bytes=max(phase_peaks.values()),
        baseline_bytes=baseline,
        phase_peaks=phase_peaks,
        device="cuda",
        how="torch.cuda.max_memory_allocated",
        seconds=seconds,
    )


def live_tensor_bytes() -> int:
    """Bytes of every live CPU tensor storage the Python heap can reach, each counted once.

    Used as the baseline of the CPU measurement: it covers parameters, buffers and the
    quantization constants that bitsandbytes keeps outside of them.
    """
    import gc

    torch = _torch()
    gc.collect()
    seen: dict[int, int] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on lazy modules may warn
        objects = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in objects:
        try:
            if obj.device.type != "cpu" or obj.is_meta:
                continue
            storage = obj.untyped_storage()
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        except (RuntimeError, NotImplementedError, ReferenceError):
            continue  # sparse, functional or otherwise storage-less tensors
    seen.pop(0, None)
    return sum(seen.values())


def _measure_cpu(arch: Architecture, setup: TrainSetup, steps: int) -> MeasuredPeak:
    _torch()  # fail with the install hint before the profiler import does
    from torch.profiler import ProfilerActivity, profile, record_function

    @contextlib.contextmanager
    def mark(name: str) -> Iterator[None]:
        with record_function(f"steadytune.{name}"):
            yield

    # The model is built before profiling starts: transformers may initialise weights on
    # worker threads, whose allocations the profiler does not see. Training runs on this
    # thread (CPU autograd runs backward on the calling thread), so every allocation of
    # the step is recorded; the baseline is the live tensors found on the heap.
    model = build_model(arch, setup, device="cpu")
    baseline = live_tensor_bytes()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        start = time.perf_counter()
        _train_steps(model, setup, "cpu", steps, mark)
        seconds = time.perf_counter() - start
    events = prof.profiler.kineto_results.events()
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    ranges = sorted(
        (e.start_ns(), e.start_ns() + e.duration_ns(), e.name().removeprefix("steadytune."))
        for e in events
        if e.name().startswith("steadytune.")
    )
    if not ranges:
        raise MeasureError("the profiler recorded no training phases; cannot locate the peak")
    live = baseline
    phase_peaks: dict[str, int] = dict.fromkeys(_PHASES, 0)
    index = 0
    for ts, nbytes in memory:
        while index < len(ranges) - 1 and ts > ranges[index][1]:
            index += 1
            # What is live when a phase begins counts for it even if it only frees.
            phase_peaks[ranges[index][2]] = max(phase_peaks[ranges[index][2]], live)
        live += nbytes
        name = ranges[index][2]
        phase_peaks[name] = max(phase_peaks[name], live)
    return MeasuredPeak(
        peak_bytes=max([baseline, *phase_peaks.values()]),
        baseline_bytes=baseline,
        phase_peaks=phase_peaks,
        device="cpu",
        how="torch.profiler(profile_memory=True): c10 CPU allocator events, summed in time order",
        seconds=seconds,
    )

"""``steadytune estimate``: peak memory per device before launch, from the config alone."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steadytune.cli._common import add_command, add_format

if TYPE_CHECKING:
    from steadytune.estimate import Architecture, MemoryEstimate, TrainSetup
    from steadytune.estimate.measure import MeasuredPeak

EXAMPLE = (
    "steadytune estimate --model examples/models/llama-3.1-8b --method lora --batch 1 --seq 2048 "
    "--device-memory 24GiB"
)

DESCRIPTION = """\
Estimate the peak memory of one device for a training step, from config.json alone (no
weights, no torch, < 2 s): weights, gradients, optimizer states, activations, logits +
loss, adapters, quantization constants, CUDA context and an allocator margin. With
--device-memory it says whether the run fits, the largest micro-batch and sequence
length that do, and what to change. --measure also trains the model for two real steps
(random weights) and reports the measured peak next to the estimate.

more examples:
  steadytune estimate run.yaml --device-memory 80GiB
  steadytune estimate --model examples/models/llama-3.2-3b --method full --dtype bf16 --precision pure \\
      --optimizer adamw8bit --batch 2 --seq 4096 --gradient-checkpointing --format json
  steadytune estimate --model examples/models/llama-3.1-8b --method full --zero 3 --gpus 8 \\
      --device-memory 80GiB

exit codes: 0 ok (fits, or no --device-memory given), 1 does not fit or --measure failed, 2 usage error
"""


def register(sub: Any) -> None:
    parser = add_command(
        sub, "estimate", "estimate peak memory per device before launch", EXAMPLE, DESCRIPTION
    )
    parser.add_argument("config", nargs="?", help="run config YAML (model, method, lora, data, train)")
    parser.add_argument("--model", help="local model directory or config.json (overrides model.name_or_path)")
    parser.add_argument(
        "--method",
        choices=["full", "lora", "qlora", "freeze"],
        help="what trains: every weight, LoRA adapters, LoRA on a 4-bit base, or the last layers "
        "(default: the config's, else lora)",
    )
    parser.add_argument("--lora-r", type=int, dest="lora_r", help="LoRA rank (default: the config's, else 8)")
    parser.add_argument(
        "--lora-dropout",
        type=float,
        dest="lora_dropout",
        help="LoRA dropout; above 0 keeps its masks (default: the config's, else 0)",
    )
    parser.add_argument(
        "--target-modules", dest="target_modules", help="comma-separated, e.g. q_proj,v_proj or all-linear"
    )
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help="compute dtype")
    parser.add_argument(
        "--precision",
        choices=["mixed", "pure"],
        help="mixed: fp32 trainable weights + autocast (HF bf16=True); pure: all in --dtype",
    )
    parser.add_argument(
        "--weights-dtype",
        choices=["fp32", "bf16", "fp16"],
        dest="weights_dtype",
        help="dtype the frozen base weights are loaded in (default: --dtype)",
    )
    parser.add_argument(
        "--optimizer",
        choices=["adamw", "adamw8bit", "sgd", "adafactor"],
        help="sets the optimizer states' size (default adamw: two fp32 states per trainable weight)",
    )
    parser.add_argument("--batch", type=int, help="micro-batch per device")
    parser.add_argument("--seq", type=int, help="sequence length (tokens per sample)")
    parser.add_argument(
        "--grad-accum",
        type=int,
        dest="gradient_accumulation_steps",
        help="gradient accumulation steps (the peak is per micro-batch; default: the config's, else 1)",
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=None,
        dest="gradient_checkpointing",
        help="recompute activations in backward, keeping one layer's, not all "
        "(default: the config's, else off)",
    )
    parser.add_argument(
        "--attn",
        choices=["sdpa", "eager", "flash"],
        help="attention kernel; eager keeps the seq x seq scores (default sdpa)",
    )
    parser.add_argument(
        "--zero", type=int, choices=[0, 1, 2, 3], dest="zero_stage", help="DeepSpeed ZeRO stage"
    )
    parser.add_argument("--fsdp", action="store_true", default=None, help="FSDP FULL_SHARD over --gpus")
    parser.add_argument("--gpus", type=int, help="data-parallel devices (shards ZeRO/FSDP states)")
    parser.add_argument(
        "--freeze-layers",
        type=int,
        dest="freeze_trainable_layers",
        help="trainable last layers for --method freeze (default 2)",
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], help="cuda adds context + allocator margin")
    parser.add_argument(
        "--device-memory", dest="device_memory", help="usable memory per device, e.g. 80GiB, 24GB"
    )
    add_format(parser)
    parser.add_argument(
        "--measure",
        action="store_true",
        help="also run two real training steps (needs torch; keep the model small on CPU)",
    )
    parser.set_defaults(func=run)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    names = (
        "method",
        "lora_r",
        "lora_dropout",
        "dtype",
        "weights_dtype",
        "optimizer",
        "batch",
        "seq",
        "gradient_accumulation_steps",
        "gradient_checkpointing",
        "attn",
        "zero_stage",
        "fsdp",
        "gpus",
        "freeze_trainable_layers",
        "device",
    )
    out = {name: getattr(args, name) for name in names}
    if args.target_modules:
        out["target_modules"] = tuple(t.strip() for t in args.target_modules.split(",") if t.strip())
    if args.precision:
        out["mixed_precision"] = args.precision == "mixed"
    return out


def _resolve_model(path: str, config_file: str | None) -> str:
    """The model folder ``path`` names, ``~`` expanded as every config path is; a relative path is
    tried from the working directory, then from the config's. A name found in neither (a hub id)
    comes back as written."""
    from steadytune.config.paths import resolve_path

    bases = [Path.cwd()] + ([Path(config_file).parent] if config_file is not None else [])
    for base in bases:
        candidate = resolve_path(path, base)
        if candidate.exists():
            return str(candidate)
    return path


def _available_ram() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def run(args: argparse.Namespace) -> int:
    from steadytune.estimate import estimate_peak, max_micro_batch, max_seq_len, suggestions
    from steadytune.estimate.report import Report, to_json, to_text

    device_memory, arch, setup, problems = _inputs(args)
    if problems or arch is None or setup is None:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2

    estimate = estimate_peak(arch, setup)
    fits = None if device_memory is None else estimate.peak_bytes <= device_memory
    best_batch = max_micro_batch(arch, setup, device_memory) if device_memory is not None else None
    measured = None
    measured_estimate = None
    code = 0 if fits is not False else 1
    if args.measure:
        measured, measured_estimate, worked = _measure(arch, setup)
        if not worked:
            code = 1

    if args.format == "json":
        print(json.dumps(to_json(estimate, fits, best_batch)))
        if measured is not None:
            # The JSON contract has exactly four keys; the measurement goes to stderr.
            print(f"measured peak {measured.peak_bytes} bytes on {measured.device}", file=sys.stderr)
        return code
    report = Report(
        arch=arch,
        setup=setup,
        estimate=estimate,
        device_memory=device_memory,
        max_micro_batch=best_batch,
        max_seq_len=max_seq_len(arch, setup, device_memory) if device_memory is not None else None,
        suggestions=tuple(suggestions(arch, setup, device_memory))
        if fits is False and device_memory is not None
        else (),
        measured=measured,
        measured_estimate=measured_estimate,
    )
    print(to_text(report))
    return code


def _inputs(
    args: argparse.Namespace,
) -> tuple[int | None, Architecture | None, TrainSetup | None, list[str]]:
    """The device memory, architecture and setup the options name, and every problem with them."""
    from steadytune.estimate import (
        ArchitectureError,
        SetupError,
        load_architecture,
        load_run_config,
        parse_bytes,
        setup_from_config_dict,
    )

    problems: list[str] = []
    device_memory = None
    if args.device_memory is not None:
        try:
            device_memory = parse_bytes(args.device_memory)
        except ValueError as exc:
            problems.append(f"--device-memory: {exc}")
    try:
        config = load_run_config(args.config) if args.config else {}
        model_path, setup = setup_from_config_dict(config, **_overrides(args))
    except SetupError as exc:
        problems.append(str(exc))
        model_path, setup = None, None
    model_path = args.model or model_path
    if model_path is None:
        problems.append("no model: pass --model DIR_OR_CONFIG_JSON or set model.name_or_path in the config")
    arch = None
    if model_path is not None:
        try:
            arch = load_architecture(_resolve_model(model_path, args.config))
        except ArchitectureError as exc:
            problems.append(str(exc))
    return device_memory, arch, setup, problems


def _measure(
    arch: Architecture, setup: TrainSetup
) -> tuple[MeasuredPeak | None, MemoryEstimate | None, bool]:
    """Two real steps (``--measure``): the measured peak, the estimate for the device it ran on, and
    whether it worked (what went wrong is printed)."""
    from steadytune.estimate import estimate_peak

    measured = None
    measured_estimate = None
    try:
        from steadytune.estimate.measure import MeasureError, measure_peak, pick_device

        device = pick_device()
        needed = estimate_peak(arch, dataclasses.replace(setup, device=device)).tensor_bytes
        if device == "cpu" and needed > 0.8 * _available_ram():
            raise MeasureError(
                f"measuring on CPU would need about {needed / 2**30:.1f} GiB of RAM; "
                "use a smaller config (fewer layers, smaller hidden size) or a GPU"
            )
        measured = measure_peak(arch, setup, device=device)
        # Compare like with like: a CPU measurement has no CUDA context.
        measured_estimate = estimate_peak(arch, dataclasses.replace(setup, device=measured.device))
    except (MeasureError, ImportError, RuntimeError) as exc:
        print(f"error: --measure failed: {exc}", file=sys.stderr)
        return measured, measured_estimate, False
    return measured, measured_estimate, True

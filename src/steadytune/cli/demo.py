"""``steadytune demo``: the main job on the embedded default, offline, in about a minute on idle CPUs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, add_overrides
from steadytune.cli.run import add_launch_options


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "demo",
        "fine-tune a tiny built-in model under supervision (offline; about a minute on 2 idle CPU cores, "
        "more on a busy machine)",
        "steadytune demo --runs-dir runs",
        description="Builds (once, cached) a tiny Llama-architecture model, a BPE tokenizer and an "
        "instruction "
        "dataset, then runs a supervised fine-tune through the same path as `steadytune run`.",
    )
    p.add_argument("--runs-dir", default="runs", help="where the run directory goes (default: ./runs)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    p.add_argument(
        "--method",
        choices=["full", "lora", "qlora"],
        default="full",
        help="full fine-tune, LoRA adapters, or QLoRA (4-bit NF4 base; runs on a CPU too) (default full)",
    )
    p.add_argument("--print-config", action="store_true", help="print the demo config as YAML and exit")
    add_overrides(p, "train.learning_rate=1")
    add_launch_options(p)
    p.set_defaults(func=main)


def demo_config(assets: Path, runs_dir: str, steps: int, method: str) -> dict[str, Any]:
    """The demo's config: the same schema a user writes, pointed at the built-in assets."""
    return {
        "model": {"name_or_path": str(assets / "model"), "dtype": "float32"},
        "method": method,
        "lora": {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"},
        "data": {
            "train_file": str(assets / "train.jsonl"),
            "eval_file": str(assets / "eval.jsonl"),
            "format": "instruction",
            "max_seq_length": 128,
        },
        "train": {
            "learning_rate": 2e-3 if method == "full" else 1e-2,
            "per_device_train_batch_size": 8,
            "gradient_accumulation_steps": 1,
            "max_steps": steps,
            "save_steps": max(1, steps // 4),
            "eval_steps": max(1, steps // 4),
            "warmup_steps": max(1, steps // 10),
            "lr_scheduler_type": "cosine",
            "logging_steps": 10,
            "seed": 42,
        },
        "run": {"runs_dir": runs_dir, "name": "demo", "keep_last": 2},
    }


def main(args: argparse.Namespace) -> int:
    import yaml

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from steadytune.cli.run import apply_modes, launch
    from steadytune.config import ConfigError
    from steadytune.config.load import apply_overrides, validate_dict
    from steadytune.train.assets import ensure_demo_assets

    # With --print-config stdout is the YAML alone (`steadytune demo --print-config > my.yaml`).
    print(
        "preparing the demo model, tokenizer and dataset (cached after the first time)...",
        file=sys.stderr if args.print_config else sys.stdout,
        flush=True,
    )
    assets = ensure_demo_assets()
    data = apply_overrides(
        demo_config(assets, str(Path(args.runs_dir).resolve()), args.steps, args.method), args.overrides
    )
    if args.print_config:
        print(yaml.safe_dump(data, sort_keys=False))
        return 0
    try:
        cfg = apply_modes(validate_dict(data, base=Path.cwd(), source="demo config"), args)
    except ConfigError as exc:
        print(exc.render())
        return 2
    return launch(cfg, quiet=args.quiet, args=args)

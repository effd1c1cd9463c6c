"""``steadytune validate CONFIG.yaml``: every config error at once, no traceback."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, add_overrides
from steadytune.config import ConfigError, load_config


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "validate",
        "check a config and report every problem at once",
        "steadytune validate examples/lora.yaml train.max_steps=10",
        description="check a config and report every problem at once, each with its key, value and fix.\n\n"
        "exit codes: 0 valid, 2 config or usage error (as check, run and estimate exit on a bad config)",
    )
    p.add_argument("config", type=Path, help="the run config YAML, e.g. examples/lora.yaml")
    add_overrides(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    t = cfg.train
    steps = f"{t.max_steps} steps" if t.max_steps > 0 else f"{t.num_train_epochs:g} epoch(s)"
    print(
        f"{args.config}: OK — {cfg.method} on {cfg.model.name_or_path}, data {cfg.data.train_file}, {steps}"
    )
    return 0

"""``steadytune check CONFIG``: the preflight, go / no-go with the reason and the fix for each finding."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, add_format, add_overrides
from steadytune.cli._common import console as _console

EXAMPLE = "steadytune check examples/check-llama-3.1-8b.yaml --device-memory 80GiB"

DESCRIPTION = """\
Check a run before it starts: free device memory against the estimated peak plus
headroom (free RAM with the CPU estimate on a CPU-only machine), RAM, disk for
checkpoints and caches, driver/CUDA/package versions and known-bad combinations, other
processes on the GPUs, writable folders; config lints (learning rate, LoRA r/alpha/
dropout, ranks beyond a matrix's size, lr_groups that match nothing or overlap, weight
decay 0 on a full fine-tune, no dropout or a high r on a small dataset, sequence length,
save_steps, gradient accumulation); and a dataset scan with
the model's tokenizer (empty, whitespace-only and duplicate samples, truncation, samples
whose labels are all masked, token ids beyond the vocabulary, invalid UTF-8, a missing
chat template). It ends with the micro-batch, gradient accumulation (same effective
batch), sequence length and gradient checkpointing that fit.

`steadytune run` performs this check first (--skip-check skips it; --force starts
despite a no-go).

more examples:
  steadytune check run.yaml train.max_steps=500
  steadytune check run.yaml --format json | jq .recommendation
  steadytune check run.yaml --headroom 2GiB --no-data
  steadytune check --quant run.yaml       # then quant-check: int8/nf4/fp8 against full precision

exit codes: 0 go (warnings allowed), 1 no-go, 2 usage or config error
"""


def register(sub: Any) -> None:
    p = add_command(sub, "check", "preflight: go / no-go before a run starts", EXAMPLE, DESCRIPTION)
    p.add_argument("config", type=Path, help="the YAML run config")
    add_overrides(p)
    add_format(p)
    p.add_argument("--headroom", default="1GiB", help="memory to keep free on each device (default 1GiB)")
    p.add_argument(
        "--device-memory",
        dest="device_memory",
        help="plan for GPUs with this much free memory (e.g. 80GiB) instead of this machine's",
    )
    p.add_argument("--no-data", dest="scan", action="store_false", help="skip the dataset scan")
    p.add_argument(
        "--reuse-scan",
        action="store_true",
        help="reuse the dataset scan's stored answer while the data, tokenizer files and data settings are "
        "unchanged (what `run` does; it keeps the check under a second)",
    )
    p.add_argument(
        "--quant",
        action="store_true",
        help="then measure what quantizing the base costs on the eval data (steadytune quant-check; "
        "loads the model, so it takes longer); a no-go of either is a no-go",
    )
    p.set_defaults(func=main)


def load(path: Path, overrides: list[str]) -> tuple[Any, list[Any]]:
    """The config, plus the loader's cross-key problems as a list (they become failed checks).

    Field errors still raise :class:`ConfigError`: such a config cannot be checked at all.
    """
    from steadytune.config import ConfigError, load_config

    try:
        return load_config(path, overrides), []
    except ConfigError as first:
        cfg = load_config(path, overrides, check_paths=False)  # raises again on field errors
        # A missing data file is reported by the dataset scan, with more detail.
        issues = [i for i in first.issues if i.key not in ("data.train_file", "data.eval_file")]
        return cfg, issues


def main(args: argparse.Namespace) -> int:
    # datasets draws progress bars while the scan builds the cache; they would garble the table.
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from steadytune.config import ConfigError
    from steadytune.estimate import parse_bytes
    from steadytune.preflight import run_preflight, to_json

    try:
        headroom = parse_bytes(args.headroom)
        device_memory = parse_bytes(args.device_memory) if args.device_memory else None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        cfg, issues = load(args.config, args.overrides)
    except ConfigError as exc:
        if args.format == "json":
            print(
                json.dumps(
                    {
                        "verdict": "config-error",
                        "go": False,
                        "issues": [{"key": i.key, "problem": i.problem, "fix": i.fix} for i in exc.issues],
                    }
                )
            )
        print(exc.render(), file=sys.stderr)
        return 2
    report = run_preflight(
        cfg,
        config_path=str(args.config),
        config_issues=issues,
        headroom=headroom,
        device_memory=device_memory,
        scan=args.scan,
        scan_cache=scan_cache_dir() if args.reuse_scan else None,
    )
    quant = None
    if args.quant:
        from steadytune.cli import quant_check
        from steadytune.quant.measure import QuantCheckError

        try:
            quant = quant_check.measure(cfg)
        except QuantCheckError as exc:
            print(f"error: quant-check: {exc}", file=sys.stderr)
            return 2
    if args.format == "json":
        doc = to_json(report)
        if quant is not None:
            from steadytune.quant.report import to_json as quant_json

            doc["quant"] = quant_json(quant)
            doc["go"] = doc["go"] and quant.verdict.go
            doc["verdict"] = "go" if doc["go"] else "no-go"
        print(json.dumps(doc))
    else:
        from steadytune.preflight.render import print_report

        console = _console(highlight=False)
        print_report(report, console)
        if quant is not None:
            print()
            quant_check.print_report(quant, "text", None)
    go = report.go and (quant is None or quant.verdict.go)
    return 0 if go else 1


def scan_cache_dir() -> Path:
    """Where ``--reuse-scan`` keeps scan answers: in steadytune's cache folder."""
    from steadytune.train.assets import default_cache_dir

    return default_cache_dir() / "scans"

"""``steadytune quant-check CONFIG | RUN``: what quantizing the base costs, on your own eval data."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, add_format, add_overrides, fail

EXAMPLE = "steadytune quant-check examples/qlora.yaml"

DESCRIPTION = """\
Measure what quantizing the base model costs before the long run, on the config's own
eval split (data.eval_file; the train file when there is none), up to quant.max_positions
scored tokens. The reference is the model in its training dtype (float32 on a CPU); the
candidates (quant.candidates) are int8 and nf4/fp4 via bitsandbytes and fp8 via torchao
(a CUDA GPU with compute capability >= 8.9 only; elsewhere a line says why it was skipped).

For each candidate: perplexity and its change, mean and p99 per-token KL(reference ||
candidate), top-1 agreement, weights, peak memory (CUDA) and tokens/s, judged against the
limits in quant: (docs/quant.md). The verdict names the candidate to use; for
method: qlora it is about the 4-bit type the run will train with.

Given a run directory instead, it checks what was trained: the adapter on the base it
trained on is the reference, against the same adapter on the full-precision base, merged
into it (the QLoRA "merge onto a different base" loss) and on each quantized base.

more examples:
  steadytune quant-check runs/qlora-1                # after training: merged vs as trained
  steadytune quant-check cfg.yaml quant.max_positions=8192 --format json
  steadytune quant-check cfg.yaml --plot quant.png
  steadytune check --quant cfg.yaml                  # the preflight, then this

exit codes: 0 go, 1 no-go, 2 usage or config error
"""


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "quant-check",
        "measure what quantizing the base costs (int8/nf4/fp8 vs full precision)",
        EXAMPLE,
        DESCRIPTION,
    )
    p.add_argument("target", type=Path, metavar="CONFIG|RUN", help="a YAML run config, or a run directory")
    add_overrides(p, "quant.max_positions=4096")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="with a run directory: let its model folder's own Python run (its config.yaml never turns "
        "this on; a config file you pass keeps its model.trust_remote_code)",
    )
    add_format(p)
    p.add_argument("--plot", type=Path, metavar="PATH", help="also draw the figures into this image (.png)")
    p.set_defaults(func=main)


def load_config_or_error(path: Path, overrides: list[str], as_json: bool) -> Any:
    """The validated config; on a config error, it is printed (and in JSON) and None returned."""
    from steadytune.config import ConfigError, load_config

    try:
        return load_config(path, overrides)
    except ConfigError as exc:
        if as_json:
            issues = [{"key": i.key, "problem": i.problem, "fix": i.fix} for i in exc.issues]
            print(json.dumps({"verdict": "config-error", "go": False, "issues": issues}))
        print(exc.render(), file=sys.stderr)
        return None


def measure(cfg: Any) -> Any:
    """The quant-check report of a validated config; raises QuantCheckError when it cannot run."""
    # torch, transformers and bitsandbytes load only now: `check` without --quant stays torch-free.
    from steadytune.quant.measure import check_config

    return check_config(cfg)


def print_report(report: Any, fmt: str, plot_path: Path | None) -> None:
    from steadytune.quant.report import plot, render_text, to_json

    if fmt == "json":
        doc = to_json(report)
        if plot_path is not None:
            doc["plot"] = str(plot(report, plot_path))
        print(json.dumps(doc))
        return
    print(render_text(report), end="")
    if plot_path is not None:
        print(f"plot: {plot(report, plot_path)}")


def run_quant_check(
    target: Path, overrides: list[str], fmt: str, plot_path: Path | None, trust_remote_code: bool = False
) -> int:
    """The check for a config or a run directory, printed; its exit code (0 go, 1 no-go, 2 error)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if target.is_dir():
        if overrides:
            return fail(
                "key=value overrides apply to a config, not to a run directory (its config is fixed)", 2
            )
        cfg = None
    else:
        cfg = load_config_or_error(target, overrides, fmt == "json")
        if cfg is None:
            return 2
    from steadytune.forensics.runview import ForensicsError
    from steadytune.quant.measure import QuantCheckError, check_run

    try:
        report = measure(cfg) if cfg is not None else check_run(target, trust_remote_code)
    except (QuantCheckError, ForensicsError) as exc:
        return fail(str(exc), 2)
    print_report(report, fmt, plot_path)
    return 0 if report.verdict.go else 1


def main(args: argparse.Namespace) -> int:
    return run_quant_check(args.target, args.overrides, args.format, args.plot, args.trust_remote_code)

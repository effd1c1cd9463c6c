"""``steadytune run CONFIG.yaml [key=value ...]``: a supervised fine-tune."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command
from steadytune.config import ConfigError, load_config
from steadytune.config.schema import SteadytuneConfig
from steadytune.rundir import RunDir


def register(sub: Any) -> None:
    p = add_command(
        sub, "run", "fine-tune a model under supervision",
        "steadytune run examples/lora.yaml train.max_steps=100 train.learning_rate=1e-4",
        description="Fine-tune a Hugging Face causal LM (full, LoRA or QLoRA) under a supervisor that watches it, "
        "checkpoints it safely and restarts it from the newest verified checkpoint when it dies.",
    )
    p.add_argument("config", type=Path, help="the YAML config (see examples/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override config keys, e.g. train.max_steps=50")
    p.add_argument("--run-id", help="name of the run directory (default: <model>-<date>-<time>-<xxxx>)")
    p.add_argument("--quiet", action="store_true", help="no live progress line")
    p.set_defaults(func=main)


def print_summary(console: Any, result: Any) -> None:
    from steadytune.supervise.progress import human_seconds

    p = result.progress
    loss = "-"
    if p.first_loss is not None and p.last_loss is not None:
        drop = 100 * (1 - p.last_loss / p.first_loss) if p.first_loss else 0.0
        loss = f"{p.first_loss:.4f} → {p.last_loss:.4f} ({drop:+.0f}% lower)" if drop >= 0 else f"{p.first_loss:.4f} → {p.last_loss:.4f}"
    rows = [
        ("state", f"{result.state} — {result.reason}"),
        ("steps", f"{p.step}" + (f"/{p.max_steps}" if p.max_steps else "")),
        ("loss first → last", loss),
        ("eval loss", f"{p.last_eval_loss:.4f}" if p.last_eval_loss is not None else "-"),
        ("tokens/s", f"{p.tokens_per_s:,.0f}" if p.tokens_per_s else "-"),
        ("skipped updates", str(p.skipped_steps)),
        ("checkpoints", ", ".join(result.checkpoints) or "none"),
        ("restarts", str(result.restarts)),
        ("wall time", human_seconds(result.wall_s)),
        ("run directory", str(result.run.root)),
    ]
    width = max(len(k) for k, _ in rows)
    console.print("")
    for k, v in rows:
        console.print(f"  {k:<{width}}  {v}", highlight=False, markup=False)
    rd = result.run.root
    console.print("\nnext:", highlight=False)
    console.print(f"  steadytune analyze {rd}            # anomalies in this run", highlight=False)
    console.print(f"  cat {rd / 'events.jsonl'}   # what happened, in order", highlight=False)
    final = rd / "final"
    if final.exists():
        console.print(f"  the trained model/adapter is in {final}", highlight=False)


def launch(cfg: SteadytuneConfig, run_id: str | None = None, quiet: bool = False,
           worker_env: dict[str, str] | None = None) -> int:
    """Create the run directory and supervise the job to its end. Shared by ``run`` and ``demo``."""
    from rich.console import Console

    from steadytune.supervise.supervisor import Supervisor, new_run_id

    console = Console(stderr=False, highlight=False, soft_wrap=True)
    rid = run_id or new_run_id(cfg, time.time())
    run = RunDir(Path(cfg.run.runs_dir) / rid)
    if (run.root / "events.jsonl").exists():
        console.print(f"error: run directory {run.root} already exists; pick another --run-id", style="red")
        return 2
    sup = Supervisor(cfg, run, console=console, worker_env=worker_env)
    console.print(f"run {rid} → {run.root}", highlight=False, markup=False)
    previous = {s: signal.signal(s, sup.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if quiet or not console.is_terminal:
            result = sup.run_to_end(live=_PlainProgress(console) if not quiet else None)
        else:
            from rich.live import Live

            with Live("", console=console, refresh_per_second=4, transient=True) as live:
                result = sup.run_to_end(live=live)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    print_summary(console, result)
    return 0 if result.state in {"completed", "stopped", "paused"} else 1


class _PlainProgress:
    """Progress for logs and pipes: one line every 10 s instead of a redrawn line."""

    def __init__(self, console: Any, every_s: float = 10.0) -> None:
        self.console, self.every_s, self._last = console, every_s, 0.0

    def update(self, line: str) -> None:
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self.console.print(line, highlight=False, markup=False)


def main(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    return launch(cfg, run_id=args.run_id, quiet=args.quiet)

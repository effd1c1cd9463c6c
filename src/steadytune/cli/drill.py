"""``steadytune drill [CONFIG] [--inject SPEC] [--json]``: prove recovery with real faults."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "drill",
        "inject faults into real supervised runs and report detection and recovery",
        "steadytune drill --inject nan,oom,spike,kill",
        description="Runs a clean reference, then one supervised run per fault (nan, oom, spike, kill, "
        "kill-during-save, hang, corrupt-checkpoint by default) on the demo model or CONFIG, and reports for each: "
        "detected, at which step, the action, recovered, steps redone, time to recover; and the final loss "
        "against the clean run.",
    )
    p.add_argument("config", nargs="?", type=Path, help="a run config (default: the built-in demo)")
    p.add_argument(
        "--inject",
        default="nan,oom,spike,kill,kill-during-save,hang,corrupt-checkpoint",
        help="comma-separated faults, each optionally @STEP (e.g. spike@61,kill)",
    )
    p.add_argument("--steps", type=int, default=120, help="max_steps of each drill run (default 120)")
    p.add_argument("--save-steps", type=int, default=20, help="checkpoint interval (default 20)")
    p.add_argument(
        "--runs-dir", type=Path, default=None, help="where the drill's runs go (default: a temp folder)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=main)


def base_config(args: argparse.Namespace) -> dict[str, Any]:
    if args.config is not None:
        from steadytune.config.load import load_config

        data = load_config(args.config).model_dump()  # paths resolved, all errors reported
    else:
        from steadytune.cli.demo import demo_config
        from steadytune.train.assets import ensure_demo_assets

        data = demo_config(ensure_demo_assets(), "runs", args.steps, "full")
    data.setdefault("train", {}).update(
        {
            "max_steps": args.steps,
            "save_steps": args.save_steps,
            "eval_steps": args.steps,
            "logging_steps": 10,
        }
    )
    data.setdefault("run", {})["name"] = "drill"
    return data


def render(report: dict[str, Any]) -> str:
    head = f"{'fault':<19}{'at':>5}{'detected':>10}{'step':>6}  {'action':<18}{'recovered':>10}{'redone':>8}{'recover s':>11}"
    lines = [head, "-" * len(head)]
    for f in report["faults"]:
        lines.append(
            f"{f['kind']:<19}{f['at_step']:>5}{'yes' if f['detected'] else 'NO':>10}"
            f"{f['detected_at_step'] if f['detected_at_step'] is not None else '-':>6}  {f['action'] or '-':<18}"
            f"{'yes' if f['recovered'] else 'NO':>10}{f['steps_redone']:>8}"
            f"{f['recovery_seconds'] if f['recovery_seconds'] is not None else '-':>11}"
        )
    clean = report["clean_final_loss"]
    lines.append("")
    lines.append(f"clean run final loss {clean:.4f}" if clean is not None else "clean run: no final loss")
    for f in report["faults"]:
        if f["final_loss"] is not None and clean:
            lines.append(
                f"  {f['kind']:<19} final loss {f['final_loss']:.4f} ({100 * (f['final_loss'] / clean - 1):+.1f}%)"
            )
    lines.append(
        f"completed: {'yes' if report['completed'] else 'NO'}   weights finite: "
        f"{'yes' if report['weights_finite'] else 'NO'}"
    )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from steadytune.config import ConfigError
    from steadytune.drill.faults import parse_inject
    from steadytune.drill.runner import as_dict, final_loss, report, run_one, weights_finite

    try:
        faults = parse_inject(args.inject, args.save_steps)
        base = base_config(args)
    except (ValueError, ConfigError) as exc:
        print(f"error: {exc}")
        return 2
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="steadytune-drill-"))
    stamp = time.strftime("%H%M%S")
    say = (lambda *a: None) if args.json else print
    say(f"drill runs in {runs_dir}")
    say("clean reference run ...")
    clean, _ = run_one(base, runs_dir, f"clean-{stamp}", None)
    clean_loss = final_loss(clean.run)
    reports = []
    for spec in faults:
        say(f"fault {spec.kind} at step {spec.at_step} ...")
        result, ext_ts = run_one(base, runs_dir, f"{spec.kind}-{stamp}", spec)
        reports.append(report(spec, result, ext_ts))
    out = {
        "faults": [{k: v for k, v in as_dict(r).items()} for r in reports],
        "completed": all(r.recovered for r in reports) and clean.state == "completed",
        "final_loss": reports[-1].final_loss if reports else clean_loss,
        "clean_final_loss": clean_loss,
        "weights_finite": weights_finite(clean.run) and all(r.recovered for r in reports),
    }
    print(json.dumps(out, indent=1) if args.json else render(out))
    ok = out["completed"] and all(r.detected for r in reports)
    return 0 if ok else 1

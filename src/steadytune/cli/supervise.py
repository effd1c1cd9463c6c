"""``steadytune supervise [options] -- CMD ...``: watch and restart a job steadytune does not run."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, fail
from steadytune.rundir import RunDir, valid_run_id


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "supervise",
        "supervise a training command that steadytune does not run itself",
        "steadytune supervise --config my.yaml --preset llamafactory --output-dir saves/sft -- "
        "llamafactory-cli train sft.yaml\n  "
        "steadytune supervise --preset trl --output-dir out -- trl sft --model_name_or_path M "
        "--dataset_name D --output_dir out",
        description="Runs CMD, follows its progress (HF log dicts on stdout, trainer_log.jsonl / trainer_state.json "
        "in --output-dir), samples the system, runs the detectors, the policy and the alerts of --config, and "
        "when the job dies, hangs or diverges kills its whole process tree and restarts it from the newest "
        "whole checkpoint (--preset or --resume-arg says how), with a lower LR after a rollback. "
        "SIGTERM/Ctrl-C stops it cleanly. See docs/recovery.md.",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="a steadytune config (the same file as for run): its detect:, policy:, alerts: and run: "
        "sections apply; model: and data: may be left out",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument(
        "--preset",
        choices=sorted(PRESET_NAMES),
        help="how the tool takes a resume checkpoint and an LR: llamafactory (key=value after its YAML), "
        "trl or hf (--flags); --resume-arg and --lr-arg override it",
    )
    p.add_argument(
        "--output-dir", type=Path, help="the job's output folder (its checkpoint-N folders live here)"
    )
    p.add_argument(
        "--resume-arg",
        help='appended on restart; {checkpoint} is replaced, e.g. "--resume_from_checkpoint {checkpoint}"',
    )
    p.add_argument(
        "--lr-arg",
        help='appended on a rollback with the lowered LR; {lr} is replaced, e.g. "--learning_rate {lr}"',
    )
    p.add_argument(
        "--base-lr",
        type=float,
        help="the job's learning rate, which a rollback scales (else train.learning_rate)",
    )
    p.add_argument(
        "--runs-dir", type=Path, default=Path("runs"), help="where the run directory goes (default ./runs)"
    )
    p.add_argument("--run-id", help="name of the run directory")
    p.add_argument(
        "--max-restarts", type=int, default=None, help="crash restarts (default run.max_restarts, 3)"
    )
    p.add_argument("--hang-floor", type=float, default=60.0, help="never call a hang below this many seconds")
    p.add_argument(
        "--hang-factor",
        type=float,
        default=10.0,
        help="or this many times the p95 interval between log lines",
    )
    p.add_argument(
        "--setup-timeout", type=float, default=1800.0, help="seconds allowed before the first progress"
    )
    p.add_argument(
        "--stop-grace",
        type=float,
        default=30.0,
        help="on SIGTERM/Ctrl-C: seconds the job gets to save and exit before it is killed (default 30)",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    p.set_defaults(func=main)


PRESET_NAMES = ("hf", "llamafactory", "trl")


def main(args: argparse.Namespace) -> int:
    from steadytune.supervise.external import PRESETS, ExternalOptions, run_external

    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        return fail("give the command to supervise after --, e.g. steadytune supervise -- python train.py", 2)
    rid = args.run_id or f"{Path(cmd[0]).name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if not valid_run_id(rid):
        return fail(f"invalid run id {rid!r}: letters, digits, '.', '_' and '-' only", 2)
    cfg = None
    if args.config is not None or args.set:
        from steadytune.config import ConfigError
        from steadytune.config.load import load_supervise_config

        if args.config is None:
            return fail("--set needs --config", 2)
        try:
            cfg = load_supervise_config(args.config, args.set)
        except ConfigError as e:
            return fail(str(e), 2)
    preset = PRESETS.get(args.preset or "", {})
    base_lr = args.base_lr
    if base_lr is None and cfg is not None and "learning_rate" in cfg.train.model_fields_set:
        base_lr = cfg.train.learning_rate
    run = RunDir(args.runs_dir.resolve() / rid)
    print(f"run {rid} → {run.root}")
    opts = ExternalOptions(
        command=cmd,
        output_dir=args.output_dir.resolve() if args.output_dir else None,
        resume_arg=args.resume_arg or preset.get("resume_arg"),
        lr_arg=args.lr_arg or preset.get("lr_arg"),
        base_lr=base_lr,
        max_restarts=args.max_restarts
        if args.max_restarts is not None
        else (cfg.run.max_restarts if cfg else 3),
        hang_floor_s=args.hang_floor,
        hang_factor=args.hang_factor,
        setup_timeout_s=args.setup_timeout,
        stop_grace_s=args.stop_grace,
    )
    return run_external(opts, run, config=cfg)

"""``steadytune supervise [options] -- CMD ...``: watch and restart a job steadytune does not run."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, fail
from steadytune.cli.run import add_launch_options
from steadytune.rundir import valid_run_id


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "supervise",
        "supervise a training command that steadytune does not run itself",
        "steadytune supervise --config my.yaml --preset llamafactory --output-dir saves/sft -- "
        "llamafactory-cli train sft.yaml\n  "
        "steadytune supervise --preset trl --output-dir out -- trl sft --model_name_or_path M "
        "--dataset_name D --output_dir out\n  "
        "steadytune supervise --preset axolotl --output-dir out --inject -- axolotl train config.yml\n  "
        "steadytune supervise --preset swift --output-dir out --inject -- swift sft --model M --dataset D "
        "--output_dir out --add_version false\n  "
        "steadytune supervise --preset hf --output-dir out --inject -- accelerate launch --num_processes 2 "
        "train.py --output_dir out",
        description="Runs CMD, follows its progress (HF log dicts or text lines naming a step and a loss "
        "on stdout, trainer_log.jsonl / trainer_state.json in --output-dir; it warns when it reads no "
        "step), samples the system, runs the detectors, the policy and the alerts of "
        "--config, and "
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
        "axolotl (--dashed-keys after its YAML), swift (ms-swift; needs --add_version false), trl or hf "
        "(--flags; hf also for accelerate launch of an HF Trainer script); --resume-arg and --lr-arg "
        "override it",
    )
    p.add_argument(
        "--output-dir",
        type=Path,
        help="the job's output folder (its checkpoint-N folders live here); with --preset, the command's "
        "own --output_dir / output_dir= (or output_dir: in the YAML of llamafactory and axolotl) when "
        "not given; without either a restart begins from step 0",
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
        help="the job's learning rate, which a rollback scales (else the LR the job logs, else "
        "train.learning_rate)",
    )
    p.add_argument(
        "--runs-dir", type=Path, default=Path("runs"), help="where the run directory goes (default ./runs)"
    )
    p.add_argument("--run-id", help="name of the run directory")
    p.add_argument(
        "--max-restarts", type=int, default=None, help="crash restarts (default run.max_restarts, 3)"
    )
    p.add_argument(
        "--hang-floor",
        type=float,
        default=None,
        help="never call a hang below this many seconds of silence (detect.pace.hang_floor_s, 60)",
    )
    p.add_argument(
        "--hang-factor",
        type=float,
        default=None,
        help="or this many times the p95 interval between steps (detect.pace.hang_factor, 10)",
    )
    p.add_argument(
        "--setup-timeout",
        type=float,
        default=None,
        help="seconds allowed before the first step (policy.setup_timeout_s, 1800)",
    )
    p.add_argument(
        "--inject",
        action="store_true",
        help="give an HF Trainer-based tool (LLaMA-Factory, TRL, axolotl, HF scripts) steadytune's guard "
        "in-process: step records with grad norm and batch fingerprints (and, on logged steps, the "
        "trainer's own fields: TRL's reward, kl, margins), the NaN skip before the update, "
        "and control requests (checkpoint, pause, stop); see docs/inject.md",
    )
    add_launch_options(p)
    p.add_argument(
        "--stop-grace",
        type=float,
        default=30.0,
        help="on SIGTERM/Ctrl-C: seconds the job gets to save and exit before it is killed (default 30)",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    p.set_defaults(func=main)


PRESET_NAMES = ("axolotl", "hf", "llamafactory", "swift", "trl")


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The command-line flags as config overrides: a flag beats the config file."""
    out = [f"run.runs_dir={args.runs_dir.resolve()}"]
    for flag, key in (
        ("max_restarts", "run.max_restarts"),
        ("hang_floor", "detect.pace.hang_floor_s"),
        ("hang_factor", "detect.pace.hang_factor"),
        ("setup_timeout", "policy.setup_timeout_s"),
    ):
        if getattr(args, flag) is not None:
            out.append(f"{key}={getattr(args, flag)}")
    return out


def main(args: argparse.Namespace) -> int:
    from steadytune.cli.run import apply_modes, launch
    from steadytune.config import ConfigError
    from steadytune.config.load import load_supervise_config
    from steadytune.supervise.command import (
        PRESETS,
        CommandOptions,
        CommandSource,
        checkpoint_folder,
        preset_problems,
    )

    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        return fail("give the command to supervise after --, e.g. steadytune supervise -- python train.py", 2)
    rid = args.run_id or f"{Path(cmd[0]).name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if not valid_run_id(rid):
        return fail(f"invalid run id {rid!r}: letters, digits, '.', '_' and '-' only", 2)
    try:
        cfg = load_supervise_config(args.config, [*args.set, *flag_overrides(args)])
        cfg = apply_modes(cfg, args)
    except ConfigError as e:
        return fail(e.render(), 2)
    problems = preset_problems(args.preset, cmd)
    if problems:
        return fail("--preset " + args.preset + ": " + "; ".join(problems), 2)
    preset = PRESETS.get(args.preset or "", {})
    config_lr = cfg.train.learning_rate if "learning_rate" in cfg.train.model_fields_set else None
    output_dir, said = checkpoint_folder(args.preset, args.output_dir, cmd)
    if said:
        print(said, file=sys.stderr)
    opts = CommandOptions(
        command=cmd,
        output_dir=output_dir.resolve() if output_dir else None,
        resume_arg=args.resume_arg or preset.get("resume_arg"),
        lr_arg=args.lr_arg or preset.get("lr_arg"),
        fresh_arg=preset.get("fresh_arg"),
        base_lr=args.base_lr,
        config_lr=config_lr,
        inject=args.inject,
        segment_bytes=cfg.run.telemetry_segment_bytes,
    )
    return launch(
        cfg,
        run_id=rid,
        quiet=args.quiet,
        args=args,
        source=lambda run: CommandSource(opts, run),
        stop_grace_s=args.stop_grace,
    )

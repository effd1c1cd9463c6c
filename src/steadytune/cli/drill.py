"""``steadytune drill [CONFIG] [--faults SPEC]`` and ``drill --supervise [--inject] -- CMD``: prove recovery
with real faults."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steadytune.cli._common import add_command, fail
from steadytune.cli.supervise import PRESET_NAMES

if TYPE_CHECKING:
    from steadytune.drill.command import SuperviseLine
    from steadytune.drill.runner import FinalLoss

NATIVE_FAULTS = "nan,oom,spike,kill,kill-during-save,hang,corrupt-checkpoint"
INJECT_FLAG = "\0inject"  # --inject given without faults after it


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "drill",
        "inject faults into real supervised runs and report detection and recovery",
        "steadytune drill --faults nan,oom,spike,kill\n  "
        "steadytune drill --supervise --faults kill,truncated,hang,lr,sigterm -- \\\n"
        "      python examples/hf_trainer_script.py --output_dir {output_dir} --model M --data "
        "train.jsonl \\\n"
        "      --max_steps 40 --save_steps 10 --learning_rate 2e-3 --step_sleep 0.05\n  "
        "steadytune drill --supervise --inject --faults nan,spike,sigterm -- python "
        "examples/hf_trainer_script.py ...",
        description="Runs a clean reference, then one supervised run per fault (nan, oom, spike, kill, "
        "kill-during-save, hang, corrupt-checkpoint by default) on the demo model or CONFIG, and reports "
        "for each: "
        "detected, at which step, the action, recovered, steps redone, time to recover; and the final loss "
        "against the clean run. With --supervise it drills a command steadytune does not run instead: "
        "each run "
        "is `steadytune supervise -- CMD`, and the faults (kill, truncated, hang, lr, sigterm) are done "
        "to its "
        "real processes from outside; with --inject each run is `supervise --inject`, and nan and spike "
        "are done "
        "inside the tool's HF Trainer by the injected guard. CMD gets a fresh output folder per run: write "
        "{output_dir} where it takes one, or the drill replaces its --output_dir value. See "
        "docs/recovery.md.",
    )
    p.add_argument(
        "words",
        nargs="*",
        metavar="CONFIG | -- CMD",
        help="a run config (default: the built-in demo); with --supervise, the command, after --",
    )
    p.add_argument(
        "--faults",
        default=None,
        help="comma-separated faults, each optionally @STEP (e.g. spike@61,kill); default: all of them",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="max_steps of each drill run (default 120); with --supervise, the command's last step where "
        "neither it nor its YAML names max_steps (it trains by epochs)",
    )
    p.add_argument(
        "--save-steps",
        type=int,
        default=None,
        help="checkpoint interval (default 20; with --supervise, the command's --save_steps, or "
        "save_steps: in its YAML with --preset llamafactory or axolotl), which places the faults",
    )
    p.add_argument(
        "--runs-dir", type=Path, default=None, help="where the drill's runs go (default: a temp folder)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    ext = p.add_argument_group("drilling a command steadytune does not run")
    ext.add_argument(
        "--supervise", action="store_true", help="drill `steadytune supervise -- CMD` instead of a native run"
    )
    ext.add_argument(
        "--inject",
        nargs="?",
        const=INJECT_FLAG,
        default=None,
        metavar="FAULTS",
        help="with --supervise: each run is `supervise --inject`, so the tool's HF Trainer carries the "
        "guard and "
        "nan and spike can be drilled too (docs/inject.md); a value after it is taken as --faults, which "
        "is also how the native drill reads `--inject FAULTS`",
    )
    ext.add_argument("--config", type=Path, help="the config supervise gets (its detect:, policy:, alerts:)")
    ext.add_argument(
        "--preset",
        choices=PRESET_NAMES,
        default="hf",
        help="how the command takes a resume checkpoint and an LR (default hf: --flags)",
    )
    ext.add_argument("--resume-arg", help="as for supervise; overrides the preset's")
    ext.add_argument("--lr-arg", help="as for supervise; overrides the preset's")
    ext.add_argument(
        "--base-lr",
        type=float,
        help="the command's learning rate, which the lr fault multiplies by 1000 and a spike's rollback "
        "lowers (default: its --learning_rate / learning_rate= value)",
    )
    ext.add_argument(
        "--hang-floor", type=float, default=8.0, help="supervise's --hang-floor in the drill (default 8 s)"
    )
    ext.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="seconds one run may take before the drill stops it and counts it failed (default 900)",
    )
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
    head = (
        f"{'fault':<19}{'at':>5}{'detected':>10}{'step':>6}  "
        f"{'action':<18}{'recovered':>10}{'redone':>8}{'recover s':>11}"
    )
    lines = [head, "-" * len(head)]
    for f in report["faults"]:
        action = f["action"] or "-"
        if f.get("rolled_back_in_process"):
            action += ", in-proc"  # no new process: its "recover s" is the reload inside the worker
        if not f.get("injected", True):
            # Neither detected nor recovered: there was nothing to detect or recover from.
            lines.append(f"{f['kind']:<19}{f['at_step']:>5}  fault not injected: nothing was proven")
            continue
        lines.append(
            f"{f['kind']:<19}{f['at_step']:>5}{'yes' if f['detected'] else 'NO':>10}"
            f"{f['detected_at_step'] if f['detected_at_step'] is not None else '-':>6}  {action:<18}"
            f"{'yes' if f['recovered'] else 'NO':>10}{f['steps_redone']:>8}"
            f"{f['recovery_seconds'] if f['recovery_seconds'] is not None else '-':>11}"
        )
    lines += loss_block(report)
    lines += goodput_block(report)
    lines.append(
        f"completed: {'yes' if report['completed'] else 'NO'}   weights finite: "
        f"{'yes' if report['weights_finite'] else 'NO'}"
    )
    missed = report.get("not_injected") or []
    if missed:
        lines.append(
            f"not injected: {', '.join(missed)} (the run never came to the fault): nothing was proven of "
            "them; place them inside the run with @STEP or a smaller --save-steps"
        )
    return "\n".join(lines)


def loss_block(report: dict[str, Any]) -> list[str]:
    """Each completed run's final loss beside the clean run's, the figure named for what it is."""
    clean, name = report["clean_final_loss"], report.get("clean_final_loss_is")
    if clean is None:
        return ["", "clean run: no final loss"]
    lines = ["", f"final loss ({name or 'as the drill reads it'}):", f"  {'clean':<19} {clean:.4f}"]
    for f in report["faults"]:
        if f["final_loss"] is None:
            continue
        # Only like against like: an eval loss is not set against a training loss.
        same = f.get("final_loss_is") == name
        versus = f"{100 * (f['final_loss'] / clean - 1):+.1f}%" if same and clean else f["final_loss_is"]
        lines.append(f"  {f['kind']:<19} {f['final_loss']:.4f} ({versus})")
    return lines


def goodput_block(report: dict[str, Any]) -> list[str]:
    """Each run's goodput and its time lost by cause, the clean run first (docs/goodput.md)."""
    from steadytune.goodput.parts import Account
    from steadytune.goodput.text import row_line

    rows = [("clean", report.get("clean_goodput"))]
    rows += [(f["kind"], f.get("goodput")) for f in report["faults"]]
    shown = [row_line(label, Account.from_dict(g)) for label, g in rows if g]
    return ["", "goodput: the share of each run's wall time kept as training", *(f"  {r}" for r in shown)]


def _summary(
    reports: list[Any], clean_ok: bool, clean_loss: FinalLoss | None, clean_finite: bool, clean_run: Any
) -> dict[str, Any]:
    """The drill's JSON: the same shape for a native and a supervised drill."""
    from steadytune.drill.runner import as_dict
    from steadytune.goodput.load import run_account

    # A fault that never landed was neither detected nor recovered from: its run says nothing of either,
    # and is listed apart rather than counted as a failed recovery.
    landed = [r for r in reports if r.injected]
    return {
        "faults": [as_dict(r) for r in reports],
        "completed": all(r.recovered for r in landed) and clean_ok,
        "final_loss": reports[-1].final_loss if reports else (clean_loss.value if clean_loss else None),
        "clean_final_loss": clean_loss.value if clean_loss else None,
        "clean_final_loss_is": clean_loss.name if clean_loss else None,
        "clean_goodput": run_account(clean_run).to_dict(),
        "weights_finite": clean_finite and all(r.recovered for r in landed),
        "not_injected": [r.kind for r in reports if not r.injected],
    }


def _finish(out: dict[str, Any], args: argparse.Namespace) -> int:
    print(json.dumps(out, indent=1) if args.json else render(out))
    # Exit 1 also where a fault was not injected: the drill proved nothing of it.
    ok = out["completed"] and all(f["detected"] and f.get("injected", True) for f in out["faults"])
    return 0 if ok else 1


def fault_words(args: argparse.Namespace) -> str | None:
    """The faults asked for: ``--faults``, or faults given after ``--inject`` (its older spelling).

    Raises:
        ValueError: faults given both ways, or a bare ``--inject`` without ``--supervise``.
    """
    after_inject = args.inject if args.inject not in (None, INJECT_FLAG) else None
    if after_inject is not None and args.faults is not None:
        raise ValueError(
            f"faults given twice (--inject {after_inject} and --faults {args.faults}): "
            "give them once, with --faults"
        )
    if args.inject == INJECT_FLAG and not args.supervise:
        raise ValueError(
            "--inject alone is for --supervise (the native worker always carries the guard); "
            "name the faults with --faults"
        )
    return args.faults if args.faults is not None else after_inject


def main(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        args.faults = fault_words(args)
    except ValueError as exc:
        return fail(str(exc), 2)
    if args.supervise:
        return main_supervise(args)
    from steadytune.config import ConfigError
    from steadytune.drill.faults import parse_inject, placement_problem
    from steadytune.drill.runner import final_loss, report, run_one, weights_finite

    if len(args.words) > 1:
        return fail(
            f"one config at most, got {' '.join(args.words)}; to drill a command, use --supervise -- CMD", 2
        )
    args.config = Path(args.words[0]) if args.words else None
    save_from = f"--save-steps {args.save_steps}" if args.save_steps else "the drill's default"
    args.save_steps = args.save_steps or 20
    args.steps = args.steps or 120
    try:
        faults = parse_inject(args.faults or NATIVE_FAULTS, args.save_steps)
        late = placement_problem(
            faults, args.steps, f"--steps {args.steps}", args.save_steps, save_from, "a larger --steps"
        )
        if late is not None:
            raise ValueError(late)
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
    reports = []
    for spec in faults:
        say(f"fault {spec.kind} at step {spec.at_step} ...")
        result, ext_ts = run_one(base, runs_dir, f"{spec.kind}-{stamp}", spec)
        reports.append(report(spec, result, ext_ts))
    out = _summary(
        reports, clean.state == "completed", final_loss(clean.run), weights_finite(clean.run), clean.run
    )
    return _finish(out, args)


def main_supervise(args: argparse.Namespace) -> int:
    """``drill --supervise -- CMD``: each run is ``steadytune supervise`` in a subprocess; faults from
    outside."""
    from steadytune.drill import external
    from steadytune.drill.runner import final_loss

    try:
        job, faults, runs_dir, placed = supervise_job(args)
    except ValueError as exc:
        return fail(str(exc), 2)
    stamp = time.strftime("%H%M%S")
    say = (lambda *a: None) if args.json else print
    say(f"drill runs in {runs_dir}")
    say(placed)
    say("clean reference run ...")
    clean = external.run_one(job, runs_dir, f"clean-{stamp}", None)
    if clean.state != "completed":
        # Faults prove nothing about a command that fails on its own: say so before spending the time.
        return fail(
            f"the clean run of the command ended {clean.state} (exit {clean.returncode}), so no fault "
            f"was run; "
            f"its output is in {clean.console}",
            1,
        )
    restarted = external.clean_run_problem(clean.run, args.hang_floor)
    if restarted is not None:
        return fail(f"{restarted} Its output is in {clean.console}", 1)
    reports = []
    for spec in faults:
        say(f"fault {spec.kind} at step {spec.at_step} ...")
        outcome = external.run_one(job, runs_dir, f"{spec.kind}-{stamp}", spec)
        if outcome.note:
            say(f"  {outcome.note}")
        if outcome.left_running:
            say(f"  still running after supervise exited (now killed): {outcome.left_running}")
        reports.append(external.report(spec, outcome))
    out = _summary(reports, True, final_loss(clean.run), external.usable(None, clean), clean.run)
    return _finish(out, args)


def supervise_job(args: argparse.Namespace) -> tuple[Any, list[Any], Path, str]:
    """The job, its faults, the runs folder of ``drill --supervise`` and where the faults' placement was
    read, in words; every problem at once.

    Raises:
        ValueError: what is wrong with the command or the options, each with its fix.
    """
    from steadytune.drill import external
    from steadytune.drill.command import float_value, with_output_dir
    from steadytune.drill.faults import parse_inject, placement_problem

    cmd = list(args.words)
    if not cmd:
        raise ValueError(
            "give the command to drill after --, e.g. steadytune drill --supervise -- "
            "python train.py --output_dir {output_dir}"
        )
    problems = []
    try:
        with_output_dir(cmd, Path("out"))
    except ValueError as exc:
        problems.append(str(exc))
    save, save_from = _job_steps(args.save_steps, "--save-steps", cmd, "save_steps", args.preset)
    if save is None:
        save, save_from = 20, "the drill's default: the command names no save_steps"
    inject = args.inject is not None
    known = external.catalogue(save, inject)
    requested = [
        w.strip()
        for w in (args.faults or (external.INJECT_FAULTS if inject else external.DEFAULT_FAULTS)).split(",")
        if w.strip()
    ]
    names = {w.partition("@")[0] for w in requested}
    inside = sorted(names & (set(NATIVE_FAULTS.split(",")) - set(known)))
    problems += _inside_fault_problems(inside, inject)
    requested = [w for w in requested if w.partition("@")[0] not in inside]
    try:
        faults = parse_inject(",".join(requested), save, known)
    except ValueError as exc:
        problems.append(str(exc))
        faults = []
    if not requested:
        default = external.INJECT_FAULTS if inject else external.DEFAULT_FAULTS
        problems.append(f"no fault to drill: give --faults, e.g. --faults {default}")
    # The job's own max_steps wins over --steps, which only says what the job does not.
    last, last_from = _job_steps(None, "--steps", cmd, "max_steps", args.preset)
    if last is None and args.steps:
        last, last_from = args.steps, f"--steps {args.steps}"
    more = "more steps (max_steps in the command or its YAML)"
    late = placement_problem(faults, last, last_from, save, save_from, more) if last else None
    if late is not None:
        problems.append(late)
    base_lr = args.base_lr or float_value(cmd, "learning_rate", args.preset)
    if base_lr is None and any(f.kind == "lr" for f in faults):
        problems.append(
            "the lr fault starts the command at 1000x its learning rate, which the command does not name: "
            "give --base-lr, or --learning_rate in the command"
        )
    if base_lr is None and any(f.kind == "spike" for f in faults):
        problems.append(
            "the spike fault's rollback lowers the command's learning rate, which the command does not name: "
            "give --base-lr, or --learning_rate in the command"
        )
    if args.config is not None and not args.config.is_file():
        problems.append(f"--config {args.config}: no such file; give a steadytune config, or leave it out")
    if problems:
        raise ValueError("\n  - ".join([f"{len(problems)} problem(s) with the drill:", *problems]))
    runs_dir = (args.runs_dir or Path(tempfile.mkdtemp(prefix="steadytune-drill-"))).resolve()
    runs_dir.mkdir(parents=True, exist_ok=True)
    line = _supervise_line(args, runs_dir, inject)
    placed = f"faults placed from save_steps {save} ({save_from})" + (
        f"; the run ends at step {last} ({last_from})" if last else "; the command names no last step"
    )
    return external.Job(tuple(cmd), line, base_lr, args.timeout), faults, runs_dir, placed


def _job_steps(
    given: int | None, option: str, cmd: list[str], key: str, preset: str | None
) -> tuple[int | None, str]:
    """A step count of the job and where it was read: the drill's own ``option``, else the command's
    ``key`` (on its command line, or in the YAML the preset's tool reads)."""
    from steadytune.supervise.command import command_setting

    if given:
        return given, f"{option} {given}"
    found = command_setting(preset, cmd, key)
    if found is None or not found[0].isdigit():
        return None, ""
    value, source = found
    where = f"{key} {value} in the command" if source == "the command" else f"{key}: {value} in {source}"
    return int(found[0]), where


def _inside_fault_problems(inside: list[str], inject: bool) -> list[str]:
    """Why each native-only fault in ``inside`` cannot be drilled on a command steadytune does not run."""
    from steadytune.drill import external

    problems = []
    if inside and inject:
        if "oom" in inside:
            problems.append(f"oom: {external.INJECTED_OOM}")
        rest = [k for k in inside if k != "oom"]
        if rest:
            problems.append(
                f"{', '.join(rest)}: a save is over before an outside watcher could catch it midway; "
                "truncated leaves the same torn checkpoint behind: drill that, or use `steadytune drill` "
                "(native)"
            )
    elif inside:
        with_inject = sorted(set(inside) & set(external.INSIDE_FAULTS))
        problems.append(
            f"{', '.join(inside)}: done through a hook inside a process steadytune runs, which a command it "
            "does not run has none of; "
            + (
                f"give --inject to drill {', '.join(with_inject)} inside an HF Trainer-based tool, "
                if with_inject
                else ""
            )
            + "drill those with `steadytune drill` (native), or leave them out "
            "(truncated is the outside form of kill-during-save and corrupt-checkpoint)"
        )
    return problems


def _supervise_line(args: argparse.Namespace, runs_dir: Path, inject: bool) -> SuperviseLine:
    """How the drill calls ``steadytune supervise``; without --config, the drill's config goes in runs_dir."""
    from steadytune.drill import external
    from steadytune.drill.command import SuperviseLine
    from steadytune.supervise.command import PRESETS

    overrides = external.drill_overrides()
    if args.config is not None:
        config, sets = args.config.resolve(), tuple(f"{k}={json.dumps(v)}" for k, v in overrides.items())
    else:  # supervise takes --set only over a file: the drill's own file holds them
        config, sets = runs_dir / "drill-supervise.yaml", ()
        config.write_text(json.dumps(nested(overrides), indent=1) + "\n")  # JSON is YAML
    preset = PRESETS[args.preset]
    return SuperviseLine(
        resume_arg=args.resume_arg or preset["resume_arg"],
        lr_arg=args.lr_arg or preset["lr_arg"],
        hang_floor_s=args.hang_floor,
        config=config,
        overrides=sets,
        inject=inject,
        preset=args.preset,
    )


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"policy.x": 1}`` → ``{"policy": {"x": 1}}``."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out

"""``steadytune analyze PATH...``: detect anomalies in any run's logs, even runs steadytune never saw.

Each path is read by the importer its content calls for (HF trainer_state.json,
LLaMA-Factory trainer_log.jsonl, trainers' printed log dicts, a steadytune run directory,
CSV, TensorBoard, Megatron text logs and golden values, Composer console logs, llm.c and
build-nanoGPT logs, JSON lines, any text log with step and loss lines) and replayed
through the live detectors.
A folder that is not itself a log (a run directory, a checkpoint, TensorBoard
events) stands for the files in it. A file that cannot be read gets a one-line
reason, on stderr and under ``unreadable`` in the JSON, and the others go on.

Exit codes: 0 every file was read and none has a warning or critical anomaly;
1 a file was unreadable or has a warning/critical anomaly (info notes do not
count); 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, add_format, console, fail

EXAMPLE = (
    "steadytune analyze output/trainer_state.json runs/2024-06-01-lora --format json --plot anomalies.png"
)


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "analyze",
        help="detect anomalies in training logs (any tool's)",
        example=EXAMPLE,
        description=(
            "Detect NaN, spikes, divergence, collapse, plateaus, oscillation, gradient and memory "
            "trouble in training logs: HF trainer_state.json, LLaMA-Factory trainer_log.jsonl, "
            "the stdout of HF Trainer / TRL / axolotl / LLaMA-Factory runs (printed log dicts), "
            "steadytune run directories, CSV (W&B, Lightning, Keras), TensorBoard event files, Megatron/"
            "DeepSpeed/NeMo text logs, Megatron golden values, Composer/llm-foundry console logs, verl, "
            "DeepSpeed-Chat, fairseq and OLMo logs, llm.c main.log and stdout, build-nanoGPT log.txt and "
            "stdout, JSON lines, JSON documents of per-step records, and any text log whose lines hold "
            "a loss, a reward or a KL as key: value (LitGPT, torchtune, nanotron, custom loops; at "
            "their step, epoch, batch count or order; torchrun, logger and Ray prefixes and colour "
            "codes are stripped, .gz files are read as they are). A folder that is not a log itself "
            "stands for the files in it. A file holding several runs says so, and each is judged on "
            "its own, at its own steps. RL and preference logs (TRL's DPO, KTO, ORPO, GRPO, RLOO, PPO, "
            "known by their fields) are judged on their reward, KL, clip ratio and grad norm, and on "
            "whether their updates carry a learning signal, not by the SFT loss rules; a loss that "
            "goes negative is never a collapse; each file says what it was judged as. Exit code 0 "
            "when every file is readable and "
            "healthy, 1 when one is unreadable or has a warning/critical anomaly."
        ),
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="log files, run directories or folders of logs")
    add_format(p)
    p.add_argument(
        "--plot",
        metavar="OUT.png",
        help="write a PNG of the series with each anomaly marked (holds every step: ~330 bytes each)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a detector threshold, e.g. --set loss.spike_z=8 (see docs/detectors.md)",
    )
    p.set_defaults(func=run)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["loss.spike_z=8", "enabled=false"]`` -> nested dict for :class:`DetectConfig`."""
    tree: dict[str, Any] = {}
    if not items:
        return tree
    import yaml

    from steadytune.config.yamlsafe import load_yaml

    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. loss.spike_z=8")
        node = tree
        parts = key.strip().removeprefix("detect.").split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        try:
            node[parts[-1]] = load_yaml(raw)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or exc
            raise ValueError(f"--set {item!r}: the value is not valid YAML ({problem})") from None
    return tree


def expand(paths: list[str]) -> list[str]:
    """The paths, each folder that is not itself a log replaced by what is in it (sorted).

    In a folder, every file is taken (hidden ones aside), so each gets a verdict or
    a reason; a subfolder only when it is a log itself (a checkpoint, a run).
    """
    from steadytune.importers import UnreadableLog, detect_format

    def is_log(path: Path) -> bool:
        try:
            detect_format(path)
        except UnreadableLog:
            return False
        return True

    out: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir() and not is_log(path):
            inside = [
                str(c)
                for c in sorted(path.iterdir())
                if not c.name.startswith(".") and (c.is_file() or (c.is_dir() and is_log(c)))
            ]
            if inside:
                out.extend(inside)
                continue
        out.append(raw)
    return out


def analyze_path(path: str, config: Any, keep_series: bool = False) -> Any:
    """Import one path and run the detectors on it; never raises for a bad file.

    A log of one run is streamed through the detectors and none of its records is kept (the
    result's ``series`` is None); ``keep_series`` (for ``--plot``) reads it whole and keeps it.
    """
    from steadytune.detect.offline import replay, replay_runs
    from steadytune.detect.report import FileResult
    from steadytune.importers import NotStreamable, UnreadableLog, load, stream

    streamed = None if keep_series else stream(path)
    if streamed is not None:
        try:
            judged = replay(streamed, (), config)
        except NotStreamable:
            pass  # read whole below: several runs, ranks, several losses, or a file with a fault
        else:
            return FileResult(
                path, streamed.format, streamed.steps, streamed.metrics, judged.anomalies,
                objective=judged.objective, notes=streamed.notes,
            )  # fmt: skip
    try:
        series = load(path)
    except UnreadableLog as e:
        return FileResult(path, error=str(e))
    except Exception as e:  # a reader bug must not stop the other files
        return FileResult(path, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'failed'}")
    judged = replay_runs(series.runs(), series.system, config)
    return FileResult(
        path,
        series.format,
        series.steps,
        series.metrics,
        judged.anomalies,
        series=series,
        objective=judged.objective,
        notes=series.notes,
    )


def run(args: argparse.Namespace) -> int:
    from steadytune.config import ConfigError
    from steadytune.config.detect import DetectConfig
    from steadytune.config.load import validate_section
    from steadytune.terminal import shown

    try:
        config = validate_section(DetectConfig, "detect", parse_overrides(args.set), "--set")
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        return 2
    except ValueError as e:
        return fail(f"invalid --set: {str(e).splitlines()[0]}", code=2)
    results = [analyze_path(p, config, keep_series=bool(args.plot)) for p in expand(args.paths)]
    for r in results:
        if r.error is not None:
            print(f"error: {shown(r.path)}: {shown(r.error)}", file=sys.stderr)
    if args.format == "json":
        from steadytune.detect.report import file_json

        doc = {
            "files": [file_json(r) for r in results if r.error is None],
            "unreadable": [{"path": r.path, "error": r.error} for r in results if r.error is not None],
        }
        print(json.dumps(doc, indent=2))
    else:
        from steadytune.detect.report import render_text

        render_text([r for r in results if r.error is None], console())  # the rest: told on stderr
    if args.plot:
        from steadytune.detect.report import plot

        try:
            out = plot(results, Path(args.plot))
        except ImportError:
            return fail("--plot needs matplotlib: pip install 'steadytune[plot]'")
        print(f"plot written to {out}", file=sys.stderr)
    bad = any(r.error is not None or r.alarming for r in results)
    return 1 if bad else 0

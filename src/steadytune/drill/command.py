"""Shaping the command a supervised drill runs: its output folder, its LR, the supervise line.

Pure functions of argument lists, so each is tested on its own without starting anything.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from steadytune.supervise.command import command_setting, flag_spellings

OUTPUT_DIR_HELP = (
    "write {output_dir} where the command takes its output folder (e.g. --output_dir {output_dir}), "
    "or pass it as --output_dir X / output_dir=X: the drill gives each fault run a folder of its own"
)


def with_output_dir(cmd: Sequence[str], out: Path) -> list[str]:
    """The command with its output folder set to ``out``.

    ``{output_dir}`` anywhere in a word is replaced; otherwise the value of
    ``--output_dir``/``--output-dir``/``output_dir=`` is.

    Raises:
        ValueError: the command names no output folder the drill could set.
    """
    if any("{output_dir}" in w for w in cmd):
        return [w.replace("{output_dir}", str(out)) for w in cmd]
    flags = flag_spellings("output_dir")
    words, hit = list(cmd), False
    for i, word in enumerate(words):
        if word in flags and i + 1 < len(words):
            words[i + 1], hit = str(out), True
        for prefix in (*(f + "=" for f in flags), "output_dir="):
            if word.startswith(prefix):
                words[i], hit = prefix + str(out), True
    if not hit:
        raise ValueError(f"the command names no output folder: {OUTPUT_DIR_HELP}")
    return words


def float_value(cmd: Sequence[str], key: str, preset: str | None = None) -> float | None:
    """``key``'s value for the job as a number (see :func:`command_setting`), or None when it is absent
    or not one."""
    found = command_setting(preset, cmd, key)
    try:
        return float(found[0]) if found is not None else None
    except ValueError:
        return None


def filled(template: str, **values: object) -> list[str]:
    """``"--learning_rate {lr}"`` → ``["--learning_rate", "3"]``: how supervise reads its templates too."""
    out = []
    for part in template.split():
        for key, value in values.items():
            part = part.replace("{" + key + "}", str(value))
        out.append(part)
    return out


@dataclass(frozen=True)
class SuperviseLine:
    """What the drill passes to ``steadytune supervise``, beside the job's command."""

    resume_arg: str
    lr_arg: str
    hang_floor_s: float
    config: Path | None = None  # the user's config; the drill's overrides go on top as --set
    overrides: tuple[str, ...] = ()
    python: str = field(default=sys.executable)
    inject: bool = False  # supervise --inject: the tool's HF Trainer carries the guard
    # supervise --preset: what the two args above do not say (a restart from the start that must keep
    # a tool from resuming by itself: LLaMA-Factory's, axolotl's fresh_arg)
    preset: str | None = None


def supervise_argv(
    line: SuperviseLine,
    job: Sequence[str],
    output_dir: Path,
    runs_dir: Path,
    run_id: str,
    base_lr: float | None = None,
) -> list[str]:
    """The ``steadytune supervise`` command line of one drill run (``base_lr``: the job's first LR)."""
    argv = [line.python, "-m", "steadytune.cli.main", "supervise"]
    if line.config is not None:
        argv += ["--config", str(line.config)]
    for item in line.overrides:
        argv += ["--set", item]
    if line.preset is not None:
        argv += ["--preset", line.preset]
    # "=": a template that starts with "--" and holds no space (axolotl's) would read as a flag of its own.
    argv += [f"--resume-arg={line.resume_arg}", f"--lr-arg={line.lr_arg}"]
    if base_lr is not None:
        argv += ["--base-lr", f"{base_lr:g}"]
    argv += ["--hang-floor", f"{line.hang_floor_s:g}", "--output-dir", str(output_dir)]
    if line.inject:
        argv.append("--inject")
    argv += ["--runs-dir", str(runs_dir), "--run-id", run_id, "--", *job]
    return argv

"""How `supervise --preset` restarts each tool: the resume, fresh-start and LR arguments it appends,
and what a preset needs of the command. The real tools run these in tests/integration/test_tool_matrix.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from steadytune.cli.main import build_parser
from steadytune.cli.supervise import PRESET_NAMES
from steadytune.drill.command import SuperviseLine, supervise_argv
from steadytune.records import PlanRevision
from steadytune.rundir import RunDir
from steadytune.supervise.command import (
    PRESETS,
    CommandOptions,
    CommandSource,
    checkpoint_folder,
    preset_problems,
)

CKPT = "/o/checkpoint-40"


def _restart(preset: str, tmp_path: Path, **plan: object) -> list[str]:
    p = PRESETS[preset]
    opts = CommandOptions(
        ["tool", "cfg"], tmp_path / "o", p["resume_arg"], p["lr_arg"], p.get("fresh_arg"), 2e-4
    )
    source = CommandSource(opts, RunDir(tmp_path / "run").create())
    return source.command_for(PlanRevision(revision=1, ts=0.0, reason="crash", **plan))[2:]  # type: ignore[arg-type]


def test_the_preset_names_the_cli_offers_are_the_presets_there_are() -> None:
    assert sorted(PRESET_NAMES) == sorted(PRESETS)


@pytest.mark.parametrize(
    ("preset", "resume", "fresh", "lr"),
    [
        ("axolotl", [f"--resume-from-checkpoint={CKPT}"], ["--no-auto-resume-from-checkpoints"],
         ["--learning-rate=0.0001"]),
        ("swift", ["--resume_from_checkpoint", CKPT], [], ["--learning_rate", "0.0001"]),
        ("hf", ["--resume_from_checkpoint", CKPT], [], ["--learning_rate", "0.0001"]),
        ("llamafactory", [f"resume_from_checkpoint={CKPT}"], ["overwrite_output_dir=true"],
         ["learning_rate=0.0001"]),
    ],
)  # fmt: skip
def test_a_restart_appends_the_tools_own_arguments(
    preset: str, resume: list[str], fresh: list[str], lr: list[str], tmp_path: Path
) -> None:
    assert _restart(preset, tmp_path, attempt=1, resume_checkpoint=CKPT) == resume
    # From the start: a tool that would resume by itself (from any checkpoint-N, whole or not) is told not to.
    assert _restart(preset, tmp_path, attempt=1) == fresh
    assert _restart(preset, tmp_path, attempt=2, resume_checkpoint=CKPT, lr_scale=0.5) == resume + lr
    assert _restart(preset, tmp_path, attempt=0) == []  # the first start is the command as given


@pytest.mark.parametrize(
    ("cmd", "ok"),
    [
        (["swift", "sft", "--output_dir", "o", "--add_version", "false"], True),
        (["swift", "sft", "--output_dir", "o", "--add_version=False"], True),
        (["swift", "sft", "--output_dir", "o"], False),
        (["swift", "sft", "--output_dir", "o", "--add_version", "true"], False),
    ],
)
def test_swift_is_resumable_only_in_one_output_folder(cmd: list[str], ok: bool) -> None:
    problems = preset_problems("swift", cmd)
    assert (problems == []) is ok
    if not ok:
        assert "--add_version false" in problems[0] and "v0-<time>" in problems[0]
    assert preset_problems("hf", cmd) == []


def test_supervise_refuses_a_swift_command_it_could_not_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser("supervise").parse_args(
        [
            "supervise",
            "--preset",
            "swift",
            "--runs-dir",
            str(tmp_path),
            "--",
            "swift",
            "sft",
            "--output_dir",
            "o",
        ]
    )
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert "add_version is not given (default true)" in err and "Fix: add --add_version false" in err
    assert not any(tmp_path.iterdir())  # nothing was started, no run directory written


def test_a_drill_passes_its_preset_on_to_supervise() -> None:
    p = PRESETS["axolotl"]
    line = SuperviseLine(p["resume_arg"], p["lr_arg"], 8.0, preset="axolotl", python="py")
    argv = supervise_argv(line, ["axolotl", "train", "c.yml"], Path("/o"), Path("/r"), "kill-1", 2.0)
    args = build_parser("supervise").parse_args(argv[3:])
    assert args.preset == "axolotl" and args.resume_arg == p["resume_arg"]


@pytest.mark.parametrize(
    ("preset", "cmd", "folder"),
    [
        ("trl", ["trl", "sft", "--model_name_or_path", "M", "--output_dir", "out6"], "out6"),
        ("hf", ["accelerate", "launch", "train.py", "--output-dir=out"], "out"),
        ("swift", ["swift", "sft", "--output_dir", "o", "--add_version", "false"], "o"),
        ("llamafactory", ["llamafactory-cli", "train", "{yaml}", "output_dir=saves/other"], "saves/other"),
        ("llamafactory", ["llamafactory-cli", "train", "{yaml}"], "saves/sft"),
        ("axolotl", ["axolotl", "train", "{yaml}"], "saves/sft"),
        ("trl", ["trl", "sft", "--model_name_or_path", "M"], None),  # TRL's default folder: not guessed
        (None, ["python", "train.py", "--output_dir", "out"], None),  # no preset: no tool's flag is known
    ],
)
def test_the_checkpoint_folder_is_the_jobs_own_output_folder_when_not_given(
    preset: str | None, cmd: list[str], folder: str | None, tmp_path: Path
) -> None:
    yaml = tmp_path / "sft.yaml"
    yaml.write_text(
        "model_name_or_path: M\noutput_dir: 'saves/sft'  # where checkpoints go\nlogging_steps: 5\n"
    )
    cmd = [w.replace("{yaml}", str(yaml)) for w in cmd]
    got, said = checkpoint_folder(preset, None, cmd)
    assert got == (Path(folder) if folder else None)
    if folder:
        assert f"checkpoints are looked for in {folder}" in said
    else:  # said before the job starts, not found out when a restart begins from step 0
        assert said.startswith("warning: no --output-dir") and "begins again from step 0" in said
    assert checkpoint_folder(preset, tmp_path / "given", cmd) == (tmp_path / "given", "")


def test_supervise_without_an_output_folder_warns_before_the_job_starts(
    tmp_path: Path, stdlib_python: str
) -> None:
    import subprocess

    from tests.conftest import STEADYTUNE

    proc = subprocess.run(
        [STEADYTUNE, "supervise", "--preset", "trl", "--runs-dir", str(tmp_path / "runs"), "--run-id", "r",
         "--", stdlib_python, "-c", "print({'loss': 1.0, 'learning_rate': 1e-5, 'epoch': 1.0})"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no --output-dir and the command names no output folder that --preset trl reads" in proc.stderr

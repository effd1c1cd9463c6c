"""The CLI imports only the subcommand it runs, so short commands start fast."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from steadytune.cli.main import build_parser, command_word


def test_command_word_is_the_first_word_that_is_not_an_option() -> None:
    assert command_word(["--version"]) is None
    assert command_word(["analyze", "a.json", "--format", "json"]) == "analyze"
    assert command_word(["--version", "diff-ckpt"]) == "diff-ckpt"
    assert command_word(["-h", "diff-ckpt"]) is None  # the top-level help lists every command
    assert command_word(["diff-ckpt", "-h"]) == "diff-ckpt"


def test_analyze_imports_neither_the_run_config_nor_the_other_commands() -> None:
    code = (
        "import sys\nfrom steadytune.cli.main import build_parser\n"
        "p = build_parser('analyze')\np.parse_args(['analyze', 'x.json'])\n"
        "print(','.join(sorted(m for m in sys.modules if m in "
        "('steadytune.cli.run', 'steadytune.config', 'steadytune.cli.dashboard', 'rich', 'numpy', "
        "'yaml'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize(
    "argv",
    [["pause", "x"], ["memory-snapshot", "x"], ["diff-ckpt", "a", "b"], ["analyze", "x"]],
    ids=" ".join,
)
def test_commands_whose_module_is_named_otherwise_still_parse(argv: list[str]) -> None:
    args = build_parser(argv[0]).parse_args(argv)
    assert callable(args.func)


def test_an_unknown_word_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser("nonsense").parse_args(["nonsense"])
    assert "analyze" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["json", "text"])  # print, and a rich Console
def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path: Path, fmt: str) -> None:
    # `steadytune ... | head -1`: the pipe's read end is gone before the CLI writes. The command
    # reads a log the test writes, so it depends on nothing a machine may or may not have.
    log = tmp_path / "train.log"
    log.write_text("".join(f"step {i} | loss {3.0 - i / 100:.3f}\n" for i in range(1, 50)))
    read, write = os.pipe()
    os.close(read)
    script = (
        "import sys; from steadytune.cli.main import entrypoint; sys.argv[0] = 'steadytune'; entrypoint()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "analyze", "--format", fmt, str(log)],
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    os.close(write)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 141

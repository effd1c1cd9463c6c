"""What ``analyze`` prints from a log (its metric names, its reasons) or from a file's name reaches
the terminal with each control character escaped: a log cannot clear the screen, set the title or
fake a line of the report."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from steadytune.cli.main import main
from steadytune.terminal import shown

EVIL_METRIC = "acc\x1b[2J\x1b]0;T\x07"
EVIL_DIR = "logs\x1b[31m\nfake"


def _csv(path: Path, header: str) -> Path:
    rows = [f"{s},{2.0 / (1 + s / 50) * (1 + 0.01 * math.sin(s))},0.5" for s in range(1, 200)]
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def _control(text: str) -> set[str]:
    return {c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F}


def test_shown_escapes_every_control_character_and_keeps_the_rest() -> None:
    assert shown("loss\x1b[2J\x07\n\x9b1m é") == "loss\\x1b[2J\\x07\\n\\x9b1m é"
    assert shown("a\u2028b\u2029c\x85d") == "a\\u2028b\\u2029c\\x85d"


@pytest.mark.parametrize("as_folder", [False, True], ids=["file", "folder"])
def test_a_metric_name_and_a_file_name_are_printed_escaped(
    tmp_path: Path, as_folder: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / EVIL_DIR
    folder.mkdir()
    log = _csv(folder / "x.csv", f"step,loss,{EVIL_METRIC}")
    broken = folder / "y.csv"
    broken.write_text("not a log\x1b]0;T\x07\n")
    main(["analyze", *([str(folder)] if as_folder else [str(log), str(broken)])])
    out = capsys.readouterr()
    assert not _control(out.out + out.err)
    assert shown(EVIL_METRIC) in out.out and shown(str(log)) in out.out
    assert shown(str(broken)) in out.err

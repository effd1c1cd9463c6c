"""The unit tests mirror the package: a newcomer finds a module's tests under the same folder name."""

from __future__ import annotations

from pathlib import Path

import steadytune

SRC = Path(steadytune.__file__).parent
UNIT = Path(__file__).parent


def test_each_unit_test_folder_is_named_after_a_package_folder() -> None:
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and not p.name.startswith("__")}
    folders = {p.name for p in UNIT.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert folders - packages == set(), "a tests/unit folder that no src/steadytune folder names"

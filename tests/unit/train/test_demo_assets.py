"""Building the demo's assets, as a first ``make demo`` does, in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from steadytune.train.assets import generate_instructions

BUILD = (
    "import sys; from pathlib import Path; from steadytune.train.assets import ensure_demo_assets; "
    "ensure_demo_assets(Path(sys.argv[1]))"
)


def test_a_first_build_prints_no_warning_of_an_optional_import(tmp_path: Path) -> None:
    """transformers imports torchao where it is installed; its import's warnings (kernels it cannot
    load here, torch's deprecation notes) are not the user's business on a first demo."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", BUILD, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert any((tmp_path / "cache").rglob("READY"))
    assert "Failed to load" not in proc.stderr
    assert "deprecated" not in proc.stderr


def test_the_demo_rows_are_distinct_and_every_task_is_among_them() -> None:
    """The preflight warns of repeated samples in a user's data: the demo's own have none."""
    rows = generate_instructions(2000, seed=1)
    assert rows == generate_instructions(2000, seed=1)  # deterministic for a seed
    assert len({(r["instruction"], r["input"], r["output"]) for r in rows}) == 2000
    assert len({r["instruction"] for r in rows}) == 5
    with pytest.raises(ValueError, match="fewer than 5000 distinct rows"):
        generate_instructions(5000)

"""Building the demo's assets, as a first ``make demo`` does, in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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

"""``steadytune demo --print-config > my.yaml``: a newcomer's first config of their own."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.conftest import STEADYTUNE


def test_print_config_writes_only_the_yaml_to_stdout(demo_assets: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [STEADYTUNE, "demo", "--print-config", "train.max_steps=70"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=True,
    )
    config = yaml.safe_load(out.stdout)
    assert config["train"]["max_steps"] == 70
    assert Path(config["model"]["name_or_path"]).is_relative_to(demo_assets)
    assert "preparing the demo model" in out.stderr
    (tmp_path / "my.yaml").write_text(out.stdout)
    assert subprocess.run([STEADYTUNE, "validate", "my.yaml"], cwd=tmp_path, timeout=300).returncode == 0

"""tests/pip_install.py for real: what uv installs of a package whose wheels are per Python runs here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.pip_install import find_uv, pip_install


@pytest.mark.slow
def test_a_package_with_a_wheel_per_python_installs_the_copy_of_this_python(tmp_path: Path) -> None:
    """multiprocess 0.70's py310 wheel, the only one of a local mirror here, installs into Python 3.11
    and then fails in ``fork_exec``; the forkserver starts through that call, so its pool maps only
    with this Python's copy, which pip takes and uv takes from the main index given first."""
    if find_uv() is None:
        pytest.skip("no uv here: pip installs, and pip takes the best wheel for this Python")
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    pip_install(python, ["multiprocess==0.70.19"])
    pool = "import multiprocess as mp; print(mp.get_context('forkserver').Pool(2).map(abs, [-1, -2]))"
    run = subprocess.run([python, "-c", pool], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[1, 2]"

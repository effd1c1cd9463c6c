"""e2e fixtures: real Chromium, real Prometheus, real sockets.

A missing tool skips its tests naming the Debian package to install; with
CI=true it fails them instead, so a CI image that lost a package cannot pass
by skipping.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from live_run import LiveRun

from steadytune.web.server import DashboardHandle, start_dashboard

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"


def require(binary: str, package: str) -> str:
    """The path of ``binary``; otherwise skip (or, under CI=true, fail) naming the package."""
    path = shutil.which(binary)
    if path:
        return path
    message = f"{binary} is not installed: apt-get install -y {package}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: e2e tools must be present, not skipped)")
    pytest.skip(message)


@pytest.fixture
def chromium() -> tuple[str, str]:
    chrome = shutil.which("chromium") or shutil.which("chromium-browser") or require("chromium", "chromium")
    driver = require("chromedriver", "chromium-driver")
    return chrome, driver


@pytest.fixture
def prometheus_bins() -> tuple[str, str]:
    return require("prometheus", "prometheus"), require("promtool", "prometheus")


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    return d


@pytest.fixture
def live_run(runs_dir: Path) -> Iterator[LiveRun]:
    run = LiveRun(runs_dir, "live-run", rate=10.0).start()
    yield run
    run.stop()


@pytest.fixture
def dashboard(runs_dir: Path) -> Iterator[DashboardHandle]:
    handle = start_dashboard(runs_dir, host="127.0.0.1", port=0)
    yield handle
    handle.stop()


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS

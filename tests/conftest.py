"""Shared fixtures: an offline environment and the demo assets, built once per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tests run several processes at once (pytest, supervisor, worker, browser) on a small
# machine: one BLAS/OpenMP thread each keeps them from oversubscribing the cores, which
# otherwise makes a tiny model's step many times slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STEADYTUNE = str(BIN / "steadytune")
_BUILDER = pytest.StashKey[subprocess.Popen[bytes]]()


@pytest.fixture(scope="session", autouse=True)
def audit_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The audit key and anchors of every run the tests write: never the user's ~/.config/steadytune.

    Set in the environment, so the supervisors and CLIs the tests start use it too.
    """
    d = tmp_path_factory.mktemp("steadytune-audit")
    os.environ["STEADYTUNE_AUDIT_DIR"] = str(d)
    return d


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache per test session, so tests never touch the user's ~/.cache."""
    d = tmp_path_factory.mktemp("steadytune-cache")
    os.environ["STEADYTUNE_CACHE"] = str(d)
    os.environ["STEADYTUNE_DATA_CACHE"] = str(d / "data")
    return d


@pytest.fixture(scope="session")
def demo_assets(cache_dir: Path) -> Path:
    from steadytune.train.assets import ensure_demo_assets

    return ensure_demo_assets(cache_dir)


@pytest.fixture(scope="session")
def stdlib_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python with the standard library alone, for the stand-in jobs that need nothing else.

    `steadytune supervise -- python ...` reads the job's interpreter into env.json, torch's build
    included: under the test venv's Python that imports torch, 2 CPU-s and 3.5 s before every such
    job starts, on what these tests do not look at. Under this one the reading finds no torch
    (0.1 s). The reading of an interpreter with torch is tested where it is looked at
    (test_envdiff.py, test_env.py) and on every run of a real tool.
    """
    import venv

    root = tmp_path_factory.mktemp("stdlib-python")
    venv.EnvBuilder(with_pip=False).create(root)
    return str(root / "bin" / "python")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the tools' venvs the session's tests will need, in the background
    (tests/tools.py): on one worker (the first) under xdist, or in a serial run."""
    if session.config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    from tests.tools import needed_tools, start_building

    builder = start_building(needed_tools(session.items))
    if builder is not None:
        session.config.stash[_BUILDER] = builder


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A build still under way is left to finish (the next session uses it), unless the session
    was interrupted: under xdist the first worker may end while another waits for that build."""
    builder = session.config.stash.get(_BUILDER, None)
    if builder is not None and exitstatus == pytest.ExitCode.INTERRUPTED:
        from tests.tools import stop_building

        stop_building(builder)


def _join_group(item: pytest.Item, group: str) -> None:
    """Put ``item`` in xdist group ``group``.

    xdist's loadgroup finds a test's group by a ``@group`` suffix on its node id, which it writes
    to ``item._nodeid``; pytest 9.2 builds ``nodeid`` from ``item._id`` instead, so that write is
    lost and every group scatters. The suffix goes on the id pytest reads; older pytest gets
    the marker and xdist's own suffix.
    """
    item.add_marker(pytest.mark.xdist_group(group))
    if not item.config.getoption("loadgroup", False):  # set on an xdist worker under --dist loadgroup
        return
    node_id = getattr(item, "_id", None)
    if node_id is not None and not item.nodeid.endswith(f"@{group}"):
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(f"{item.nodeid}@{group}")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# Ahead of xdist's own hook, which reads each test's xdist_group to pick its worker.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``serial`` share one xdist group, as do those of one ``xdist_group`` (a tool's tests
    that share its runs); tests marked ``gpu`` are skipped without CUDA.

    Under ``-n N --dist loadgroup`` (``make test``) a group runs on one worker, one test after
    another: the serial tests (Ray clusters, drills that time a hang) never overlap each other,
    while the other workers take the rest. A serial run ignores the group.

    A test marked ``gpu`` needs a CUDA device: without one it is skipped, never failed. torch is
    imported only when such a test was collected, so torch-free runs stay torch-free.
    """
    for item in items:
        if item.get_closest_marker("serial"):
            _join_group(item, "serial")
            continue
        group = item.get_closest_marker("xdist_group")  # tests that share a module's run: one worker
        if group is not None:
            _join_group(item, group.args[0] if group.args else group.kwargs["name"])
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marker gpu)")
    for item in gpu:
        item.add_marker(skip)

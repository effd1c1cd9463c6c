"""tests/tools.py: parallel test workers that both need a tool venv build it once between them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.waiting import wait_for

# One "worker": asks for the target, and when it is the one building, holds the build open until
# the test creates ``go``, so the other worker asks while the build is under way.
WORKER = """
import sys
from pathlib import Path
from tests.tools import built_once
from tests.waiting import wait_for

target, me = Path(sys.argv[1]), sys.argv[2]

def build():
    with open(target.parent / "builds.txt", "a") as log:
        log.write(me + "\\n")
    wait_for(lambda: (target.parent / "go").exists(), 120, "go")
    target.mkdir()
    (target / ".ready").write_text("ok\\n")

print("asking", flush=True)
built_once(target, build)
print("ready", (target / ".ready").exists(), flush=True)
"""


def _worker(target: Path, me: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(target), me], stdout=subprocess.PIPE, text=True, env=env
    )


def test_a_second_worker_waits_for_the_first_build_and_does_not_build_again(tmp_path: Path) -> None:
    target = tmp_path / "venvs" / "tool-abc"
    builds = target.parent / "builds.txt"
    first = _worker(target, "first")
    wait_for(lambda: builds.exists() and builds.read_text() == "first\n", 60, "the first build to start")
    second = _worker(target, "second")
    assert second.stdout is not None and second.stdout.readline() == "asking\n"
    (target.parent / "go").touch()
    out_first, _ = first.communicate(timeout=120)
    out_second, _ = second.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0
    assert out_first.splitlines()[-1] == "ready True" and out_second.splitlines()[-1] == "ready True"
    assert builds.read_text() == "first\n"  # the second found it built, under the lock


def test_a_ready_target_is_not_built_and_takes_no_lock(tmp_path: Path) -> None:
    from tests.tools import built_once

    target = tmp_path / "tool-abc"
    target.mkdir()
    (target / ".ready").write_text("ok\n")

    def build() -> None:
        raise AssertionError("a ready target was built again")

    built_once(target, build)
    assert not (tmp_path / "tool-abc.lock").exists()

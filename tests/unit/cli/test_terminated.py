"""A command stopped by SIGTERM cleans up what it made in the temporary folder, as after a Ctrl-C.

Real commands, real signals: ``analyze`` of a ``.gz`` log left its unpacked copy behind, a stopped
dashboard its cache folder.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[3]


def start(tmp: Path, *argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    return subprocess.Popen(
        [sys.executable, "-m", "steadytune.cli.main", *argv],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def long_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A gzipped log long enough (400,000 steps, 24 MB unpacked) to be read for a while once unpacked.
    The analyze tests only read it, so one copy serves them; gzip's fastest level, as the size of the
    unpacked copy is what the tests need, not a small archive."""
    log = tmp_path_factory.mktemp("long-log") / "train.jsonl.gz"
    rows = (
        json.dumps({"step": s, "loss": 2.0 - s * 1e-6, "learning_rate": 1e-4}) + "\n" for s in range(400_000)
    )
    log.write_bytes(gzip.compress("".join(rows).encode(), compresslevel=1))
    return log


def made(tmp: Path, prefix: str) -> list[Path]:
    return sorted(tmp.glob(f"{prefix}*"))


def test_a_terminated_analyze_leaves_no_unpacked_copy(tmp_path: Path, long_log: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = start(tmp, "analyze", str(long_log))
    wait_for(lambda: made(tmp, "steadytune-gunzip-") or proc.poll() is not None, what="the unpacked copy")
    assert proc.poll() is None, "analyze ended before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert made(tmp, "steadytune-gunzip-") == []


def test_the_copy_of_a_killed_analyze_is_removed_by_the_next_one(tmp_path: Path, long_log: Path) -> None:
    """A SIGKILL (an OOM kill) runs no clean-up: the copy, up to 4 GiB, stayed in the temporary
    folder for good. The next analyze removes it, and keeps a live one's."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    killed = start(tmp, "analyze", str(long_log))
    wait_for(lambda: made(tmp, "steadytune-gunzip-") or killed.poll() is not None, what="the unpacked copy")
    assert killed.poll() is None, "analyze ended before it could be killed"
    left = made(tmp, "steadytune-gunzip-")
    live = start(tmp, "analyze", str(long_log))  # started before the kill: its copy is not the dead one's
    wait_for(
        lambda: len(made(tmp, "steadytune-gunzip-")) == 2 or live.poll() is not None, what="a second copy"
    )
    killed.kill()
    killed.wait(timeout=60)
    assert set(left) <= set(made(tmp, "steadytune-gunzip-")), "a SIGKILL runs no clean-up"
    small = tmp_path / "small.jsonl.gz"
    small.write_bytes(gzip.compress(b"".join(b'{"step": %d, "loss": 2.0}\n' % s for s in range(50))))
    after = start(tmp, "analyze", str(small))
    _, err = after.communicate(timeout=120)
    assert "Traceback" not in err, err
    kept = made(tmp, "steadytune-gunzip-")
    assert not set(left) & set(kept), "the killed analyze's copy is still there"
    assert live.poll() is not None or len(kept) == 1, "a running analyze's copy was removed"
    live.kill()
    live.wait(timeout=60)


def test_a_terminated_dashboard_leaves_no_cache_folder(tmp_path: Path) -> None:
    tmp, runs = tmp_path / "tmp", tmp_path / "runs"
    tmp.mkdir()
    runs.mkdir()
    proc = start(tmp, "dashboard", str(runs), "--port", "0")
    wait_for(lambda: made(tmp, "steadytune-dash-") or proc.poll() is not None, what="the cache folder")
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    # 0 once it serves (a stop it was asked for), 143 while it was still starting: clean either way.
    assert proc.returncode in (0, 143) and "Traceback" not in err, err
    assert made(tmp, "steadytune-dash-") == []

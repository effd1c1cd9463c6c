"""Which checkpoints a real run keeps: LAST_GOOD only after a healthy window, retention that really deletes,
and no save on a disk that cannot hold it (a real 20 MiB filesystem)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadytune.checkpoint.manifest import verify
from steadytune.checkpoint.store import read_pointer
from steadytune.rundir import RunDir
from steadytune.telemetry.events import read_events

from .runs import finish, run_dir, start_run, status, steps, write_config

pytestmark = pytest.mark.slow
MiB = 1 << 20


def checkpoint_dirs(run: RunDir) -> list[str]:
    return sorted((p.name for p in run.checkpoints.glob("checkpoint-*")), key=lambda n: int(n.split("-")[1]))


@pytest.mark.parametrize("trouble", [False, True], ids=["healthy", "nan-after-checkpoint-20"])
def test_last_good_is_not_promoted_when_trouble_follows_a_checkpoint(
    tmp_path: Path, demo_assets: Path, trouble: bool
) -> None:
    # Checkpoints at 10 and 20; the run dies at step 26 (no restart budget), so no later checkpoint and no
    # completion can move LAST_GOOD afterwards. A NaN at step 22 falls inside checkpoint-20's window (3
    # steps).
    cfg = write_config(tmp_path, demo_assets, train={"max_steps": 40, "save_steps": 10},
                       run={"max_restarts": 0, "good_window_steps": 3})  # fmt: skip
    faults = {"crash_at_step": 26, **({"nan_at_step": 22} if trouble else {})}
    rc, out = finish(start_run(cfg, "last-good", faults=faults))
    assert rc == 1, out
    run = run_dir(cfg, "last-good")
    assert status(run)["state"] == "failed" and steps(run)[-1].step == 26
    assert (
        read_pointer(run.latest_pointer).name == "checkpoint-20"
        and verify(run.checkpoints / "checkpoint-20").ok
    )
    if trouble:
        events = read_events(run.events)
        assert [e.step for e in events if e.name == "nan_loss" and e.kind == "anomaly"] == [22]
        assert read_pointer(run.last_good_pointer).name == "checkpoint-10"  # 20 was followed by trouble
    else:
        assert read_pointer(run.last_good_pointer).name == "checkpoint-20"


def test_retention_deletes_all_but_the_newest(tmp_path: Path, demo_assets: Path) -> None:
    # A LAST_GOOD window longer than the run: no pointer is protected until the end, so exactly keep_last
    # stay.
    cfg = write_config(tmp_path, demo_assets, train={"max_steps": 25, "save_steps": 5},
                       run={"keep_last": 2, "good_window_steps": 1000})  # fmt: skip
    rc, out = finish(start_run(cfg, "keep"))
    assert rc == 0, out
    run = run_dir(cfg, "keep")
    saved = [e for e in read_events(run.events) if e.name == "checkpoint_saved"]
    assert [e.step for e in saved] == [5, 10, 15, 20, 25] and all(e.data["bytes"] > MiB for e in saved)
    assert checkpoint_dirs(run) == ["checkpoint-20", "checkpoint-25"]
    for e in saved[:3]:  # gone from the disk, not just from a listing
        assert not Path(e.data["path"]).exists()
    assert all(verify(run.checkpoints / n).ok for n in checkpoint_dirs(run))
    assert not run.staging.exists() or not any(run.staging.iterdir())
    on_disk = sum(p.stat().st_size for p in run.checkpoints.rglob("*") if p.is_file())
    assert on_disk < 2.5 * saved[-1].data["bytes"]
    assert read_pointer(run.last_good_pointer).name == "checkpoint-25"  # the completed run's last


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 20 MiB filesystem (tmpfs); mounting one needs root or CAP_SYS_ADMIN."""
    mount = shutil.which("mount")
    if mount is None:
        pytest.skip("no mount(8) here: cannot make a small filesystem for the disk-full test")
    path = tmp_path / "small"
    path.mkdir()
    done = subprocess.run([mount, "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(path)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"mounting a 20 MiB tmpfs is not permitted here ({done.stderr.strip()}): needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


def test_a_save_the_disk_cannot_hold_is_refused(tmp_path: Path, demo_assets: Path, small_disk: Path) -> None:
    # Checkpoints are ~5 MiB; a save needs the newest checkpoint's size plus 7 MiB free. On 20 MiB the
    # first two fit (20 then ~15 MiB free), the third would leave too little (~10 free, ~12 needed).
    cfg = write_config(
        tmp_path,
        demo_assets,
        train={"max_steps": 30, "save_steps": 5},
        run={"runs_dir": str(small_disk / "runs"), "min_free_disk_bytes": 7 * MiB, "keep_last": 10},
    )
    rc, out = finish(start_run(cfg, "full-disk"))
    assert rc == 0, out  # the run goes on without the checkpoints it cannot afford, and says so
    run = RunDir(small_disk / "runs" / "full-disk")
    events = read_events(run.events)
    assert [e.step for e in events if e.name == "checkpoint_saved"] == [5, 10]
    # The worker's refusals; the supervisor's own disk_low (free space below what the checkpoints still to
    # come need, judged on its system samples) may be filed too, whenever a sample happens to show it.
    refused = [e for e in events if e.kind == "anomaly" and e.name == "disk_low" and "skipped" in e.message]
    assert [e.step for e in refused] == [15, 20, 25, 30], [(e.step, e.message, e.data) for e in refused]
    assert {e.severity for e in refused} == {"critical"}
    newest = sum(p.stat().st_size for p in (run.checkpoints / "checkpoint-10").rglob("*") if p.is_file())
    for e in refused:
        have, need = (int(x) for x in re.search(r"only (\d+) MiB free .* need (\d+) MiB", e.message).groups())
        assert have < need == round((newest + 7 * MiB) / MiB), e.message
    assert checkpoint_dirs(run) == ["checkpoint-5", "checkpoint-10"]  # nothing half-written
    assert all(verify(run.checkpoints / n).ok for n in checkpoint_dirs(run))
    assert not run.staging.exists() or not any(run.staging.iterdir())
    assert read_pointer(run.latest_pointer).name == "checkpoint-10"
    assert shutil.disk_usage(small_disk).free > 0

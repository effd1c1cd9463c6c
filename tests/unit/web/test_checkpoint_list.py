"""The run page's checkpoint list: the checkpoint module's size check and pointer reading, as resume uses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from steadytune.checkpoint.manifest import MANIFEST, verify, write_manifest
from steadytune.checkpoint.store import pointer_name, read_pointer, write_pointer
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.web.runs import RunEntry, checkpoint_info


def _run(tmp_path: Path, steps: tuple[int, ...] = (5, 10)) -> RunDir:
    run = RunDir(tmp_path / "r1")
    for step in steps:
        d = run.checkpoints / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(bytes(range(64)))
        write_manifest(d, step)
    return run


def test_a_pointer_to_a_removed_folder_is_still_shown_by_name(tmp_path: Path) -> None:
    run = _run(tmp_path)
    write_pointer(run.latest_pointer, run.checkpoints / "checkpoint-10")
    write_pointer(run.last_good_pointer, run.checkpoints / "checkpoint-5")
    shutil.rmtree(run.checkpoints / "checkpoint-10")  # retention or a person removed it
    listed = RunEntry(run, tmp_path / "cache").checkpoints()
    assert listed["latest"] == "checkpoint-10" and listed["last_good"] == "checkpoint-5"
    assert [(c["name"], c["last_good"]) for c in listed["items"]] == [("checkpoint-5", True)]
    assert read_pointer(run.latest_pointer) is None  # resume wants the folder, the page only the name


def test_a_pointer_naming_a_path_is_no_checkpoint_anywhere(tmp_path: Path) -> None:
    run = _run(tmp_path)
    for bad in ("../other-run/checkpoint-5", ".staging", "a\\b", ""):
        atomic_write_text(run.latest_pointer, bad + "\n")
        assert pointer_name(run.latest_pointer) is None and read_pointer(run.latest_pointer) is None
        assert RunEntry(run, tmp_path / "cache").checkpoints()["latest"] is None


def test_the_page_checks_sizes_only_and_says_what_resume_would(tmp_path: Path) -> None:
    run = _run(tmp_path, (5,))
    ckpt = run.checkpoints / "checkpoint-5"
    weights = ckpt / "model.safetensors"
    weights.write_bytes(bytes(reversed(range(64))))  # same size, other bytes
    info = checkpoint_info(ckpt)
    assert info["verified"] is True and info["size_bytes"] == 64 and info["step"] == 5
    assert "sha256 mismatch" in verify(ckpt).reason  # what only the resume check catches

    weights.write_bytes(b"short")
    info = checkpoint_info(ckpt)
    assert info["verified"] is False and info["size_bytes"] is None
    assert (
        info["problem"]
        == verify(ckpt).reason
        == "model.safetensors has 5 bytes, manifest says 64 (truncated?)"
    )


def test_a_manifest_resume_would_refuse_is_not_verified_on_the_page(tmp_path: Path) -> None:
    run = _run(tmp_path, (5,))
    ckpt = run.checkpoints / "checkpoint-5"
    for files in ({}, {"model.safetensors": {"sha256": "0" * 64}}):  # no file listed; no size listed
        atomic_write_text(ckpt / MANIFEST, json.dumps({"step": 5, "files": files}))
        info = checkpoint_info(ckpt)
        assert info["verified"] is False and not verify(ckpt, deep=False).ok
        assert info["problem"] == verify(ckpt, deep=False).reason and info["step"] == 5

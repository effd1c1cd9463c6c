from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.checkpoint.manifest import MANIFEST, list_checkpoints, newest_verified, verify, write_manifest
from steadytune.checkpoint.store import (
    DiskFullError,
    apply_retention,
    ensure_free_space,
    publish,
    read_pointer,
    write_pointer,
)


def make_ckpt(root: Path, step: int, sealed: bool = True) -> Path:
    d = root / f"checkpoint-{step}"
    (d / "sub").mkdir(parents=True)
    (d / "model.safetensors").write_bytes(bytes(range(256)) * 40)
    (d / "sub" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if sealed:
        write_manifest(d, step)
    return d


def test_manifest_verifies_and_lists_every_file(tmp_path: Path) -> None:
    d = make_ckpt(tmp_path, 10)
    m = json.loads((d / MANIFEST).read_text())
    assert set(m["files"]) == {"model.safetensors", "sub/trainer_state.json"}
    assert m["step"] == 10 and m["total_bytes"] == 10240 + len(json.dumps({"global_step": 10}))
    assert verify(d).ok


def test_truncated_file_is_caught(tmp_path: Path) -> None:
    d = make_ckpt(tmp_path, 10)
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(100)
    v = verify(d)
    assert not v.ok and "truncated" in v.reason and "model.safetensors" in v.reason


def test_bit_flip_is_caught_by_sha256_but_not_by_sizes_alone(tmp_path: Path) -> None:
    d = make_ckpt(tmp_path, 10)
    data = bytearray((d / "model.safetensors").read_bytes())
    data[5000] ^= 0x01
    (d / "model.safetensors").write_bytes(bytes(data))
    assert verify(d, deep=False).ok  # same size
    v = verify(d)
    assert not v.ok and "sha256" in v.reason


def test_missing_manifest_or_file_means_unusable(tmp_path: Path) -> None:
    assert "no MANIFEST" in verify(make_ckpt(tmp_path, 5, sealed=False)).reason
    d = make_ckpt(tmp_path, 6)
    (d / "sub" / "trainer_state.json").unlink()
    assert "missing" in verify(d).reason
    (make_ckpt(tmp_path, 7) / MANIFEST).write_text("{not json")
    assert "unreadable" in verify(tmp_path / "checkpoint-7").reason


def test_newest_verified_skips_bad_ones_and_reports_them(tmp_path: Path) -> None:
    make_ckpt(tmp_path, 10)
    make_ckpt(tmp_path, 20)
    bad = make_ckpt(tmp_path, 30)
    (bad / "model.safetensors").write_bytes(b"x")
    make_ckpt(tmp_path, 40, sealed=False)
    good, skipped = newest_verified(tmp_path)
    assert good is not None and good.path.name == "checkpoint-20"
    assert [s.path.name for s in skipped] == ["checkpoint-40", "checkpoint-30"]
    good, _ = newest_verified(tmp_path, max_step=15)
    assert good.path.name == "checkpoint-10"


def test_publish_seals_only_after_the_rename(tmp_path: Path) -> None:
    staged = tmp_path / ".staging" / "checkpoint-5"
    staged.mkdir(parents=True)
    (staged / "w.bin").write_bytes(b"abc")
    seen = {}

    def crash_window(path: Path) -> None:
        seen["in_window"] = verify(path).ok
        seen["exists"] = path.is_dir()

    final = publish(staged, tmp_path, 5, before_manifest=crash_window)
    assert seen == {"in_window": False, "exists": True}  # a crash here leaves an unusable checkpoint
    assert verify(final).ok and not staged.exists()


def test_retention_keeps_last_n_and_the_protected(tmp_path: Path) -> None:
    for s in (10, 20, 30, 40, 50):
        make_ckpt(tmp_path, s)
    deleted = apply_retention(tmp_path, keep_last=2, protect={tmp_path / "checkpoint-10"})
    assert sorted(p.name for p in deleted) == ["checkpoint-20", "checkpoint-30"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-50", "checkpoint-40", "checkpoint-10"]


def test_pointers_are_names_and_ignore_dangling_or_hostile(tmp_path: Path) -> None:
    d = make_ckpt(tmp_path, 10)
    write_pointer(tmp_path / "LATEST", d)
    assert (tmp_path / "LATEST").read_text() == "checkpoint-10\n"
    assert read_pointer(tmp_path / "LATEST") == d
    (tmp_path / "LAST_GOOD").write_text("../../etc\n")
    assert read_pointer(tmp_path / "LAST_GOOD") is None
    (tmp_path / "X").write_text("checkpoint-99\n")
    assert read_pointer(tmp_path / "X") is None
    assert read_pointer(tmp_path / "absent") is None


def test_disk_check_names_the_shortfall(tmp_path: Path) -> None:
    ensure_free_space(tmp_path, 10, free=lambda _: 100)
    with pytest.raises(DiskFullError, match=r"free disk space or lower run\.keep_last"):
        ensure_free_space(tmp_path, 200 * 1024**2, free=lambda _: 10 * 1024**2)


def test_the_keeper_deletes_old_checkpoints_but_never_last_good(tmp_path: Path) -> None:
    from steadytune.guard.checkpoints import CheckpointKeeper
    from steadytune.rundir import RunDir

    run = RunDir(tmp_path / "run").create()
    keeper = CheckpointKeeper(run, keep_last=1, min_free_bytes=0)

    def save(step: int) -> Path:
        staged = run.staging / f"checkpoint-{step}"
        staged.mkdir(parents=True)
        (staged / "model.safetensors").write_bytes(bytes(range(256)) * 4)
        return keeper.publish(staged, step)

    def on_disk() -> list[str]:
        return sorted(p.name for p in run.checkpoints.glob("checkpoint-*"))

    first = save(5)
    write_pointer(run.last_good_pointer, first)  # the supervisor found checkpoint-5 good
    save(10)
    assert on_disk() == ["checkpoint-10", "checkpoint-5"]
    save(15)
    assert on_disk() == ["checkpoint-15", "checkpoint-5"]  # 10 is gone from the disk, LAST_GOOD stays
    assert not (run.checkpoints / "checkpoint-10").exists() and verify(first).ok
    write_pointer(run.last_good_pointer, run.checkpoints / "checkpoint-15")
    save(20)
    assert on_disk() == ["checkpoint-15", "checkpoint-20"]
    assert read_pointer(run.latest_pointer).name == "checkpoint-20"


def test_sealing_hashes_in_one_pass_what_a_second_read_would_find(tmp_path: Path) -> None:
    from steadytune.checkpoint.manifest import seal_tree, sha256_file

    d = tmp_path / "staged"
    (d / "sub").mkdir(parents=True)
    (d / "big.bin").write_bytes(bytes(range(256)) * 70_000)  # over two 8 MiB read chunks
    (d / "sub" / "small.json").write_text('{"a": 1}')
    (d / "empty").write_bytes(b"")
    files = seal_tree(d, workers=3)
    assert files == {
        rel: {"size": (d / rel).stat().st_size, "sha256": sha256_file(d / rel)}
        for rel in ("big.bin", "empty", "sub/small.json")
    }
    assert seal_tree(d, workers=1) == files


def test_a_file_changed_after_sealing_fails_verification(tmp_path: Path) -> None:
    from steadytune.checkpoint.manifest import verify
    from steadytune.checkpoint.store import publish

    staged = tmp_path / "staging" / "checkpoint-4"
    staged.mkdir(parents=True)
    (staged / "model.safetensors").write_bytes(b"w" * 1000)
    (tmp_path / "ckpts").mkdir()

    def flip(final: Path) -> None:  # in the window between the rename and the manifest
        (final / "model.safetensors").write_bytes(b"x" * 1000)

    final = publish(staged, tmp_path / "ckpts", 4, before_manifest=flip)
    verdict = verify(final)
    assert not verdict.ok and "sha256 mismatch" in verdict.reason
    (final / "model.safetensors").write_bytes(b"w" * 1000)
    assert verify(final).ok

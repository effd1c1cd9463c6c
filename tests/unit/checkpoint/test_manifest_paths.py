"""A MANIFEST.json may only name files inside its checkpoint: every reader rejects the others.

A manifest is read by the resume check (``verify``), the repro bundle (which copies the
listed files) and the dashboard (which reports their sizes). A manifest naming
``../../etc/shadow`` made the dashboard stat that file; now the checkpoint is invalid
everywhere, with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.checkpoint.manifest import (
    MANIFEST,
    ManifestError,
    load_manifest,
    newest_verified,
    read_manifest,
    sha256_file,
    verify,
    write_manifest,
)
from steadytune.web.runs import checkpoint_info


def _ckpt(root: Path, step: int = 10) -> Path:
    d = root / "run" / "checkpoints" / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"w" * 64)
    write_manifest(d, step)
    return d


def _list(ckpt: Path, rel: str, target: Path) -> None:
    """Add ``rel`` to the manifest with ``target``'s true size and hash (so only the path is wrong)."""
    m = json.loads((ckpt / MANIFEST).read_text())
    m["files"][rel] = {"size": target.stat().st_size, "sha256": sha256_file(target)}
    (ckpt / MANIFEST).write_text(json.dumps(m))


@pytest.fixture()
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "secret" / "shadow"
    secret.parent.mkdir()
    secret.write_text("root:x:0:0\n")
    return secret


def _escaping(kind: str, ckpt: Path, outside: Path) -> str:
    if kind == "absolute":
        return str(outside)
    if kind == "dotdot":
        depth = len(ckpt.relative_to(outside.parent.parent).parts)
        return "/".join([".."] * depth + ["secret", "shadow"])
    (ckpt / "extra.bin").symlink_to(outside)  # kind == "symlink": a name inside, a file outside
    return "extra.bin"


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "symlink"])
def test_a_manifest_naming_a_path_outside_the_checkpoint_is_invalid_everywhere(
    tmp_path: Path, outside: Path, kind: str
) -> None:
    ckpt = _ckpt(tmp_path)
    rel = _escaping(kind, ckpt, outside)
    assert (ckpt / rel).resolve() == outside.resolve()  # the file really is there to be read
    _list(ckpt, rel, outside)

    with pytest.raises(ManifestError, match="outside the checkpoint"):
        load_manifest(ckpt)
    assert read_manifest(ckpt) is None
    for deep in (True, False):
        v = verify(ckpt, deep=deep)
        assert not v.ok and "outside the checkpoint" in v.reason and rel in v.reason
    good, skipped = newest_verified(ckpt.parent)
    assert good is None and [s.path for s in skipped] == [ckpt]  # never resumed

    info = checkpoint_info(ckpt)  # the dashboard
    assert info["verified"] is False and "outside the checkpoint" in info["problem"]
    assert info["size_bytes"] is None  # the outside file's size is not reported


def test_a_manifest_that_is_itself_a_link_outside_is_invalid(tmp_path: Path, outside: Path) -> None:
    ckpt = _ckpt(tmp_path)
    real = tmp_path / "elsewhere.json"
    real.write_text((ckpt / MANIFEST).read_text())
    (ckpt / MANIFEST).unlink()
    (ckpt / MANIFEST).symlink_to(real)
    assert not verify(ckpt).ok and "outside the checkpoint" in verify(ckpt).reason
    assert checkpoint_info(ckpt)["verified"] is False


def test_plain_relative_paths_in_folders_still_verify(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint-3"
    (ckpt / "sub" / "deeper").mkdir(parents=True)
    (ckpt / "sub" / "deeper" / "a.bin").write_bytes(b"a")
    (ckpt / "b.json").write_text("{}")
    write_manifest(ckpt, 3)
    assert verify(ckpt).ok
    assert set(load_manifest(ckpt).files) == {"sub/deeper/a.bin", "b.json"}
    info = checkpoint_info(ckpt)
    assert info["verified"] is True and info["size_bytes"] == 3 and info["step"] == 3


@pytest.mark.parametrize("rel", ["", ".", "sub/..", "a\\..\\..\\x", "C:/Windows/x", "a\x00b"])
def test_odd_names_are_rejected(tmp_path: Path, rel: str) -> None:
    ckpt = _ckpt(tmp_path)
    m = json.loads((ckpt / MANIFEST).read_text())
    m["files"][rel] = {"size": 1, "sha256": "0" * 64}
    (ckpt / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(ManifestError):
        load_manifest(ckpt)
    assert not verify(ckpt).ok and checkpoint_info(ckpt)["verified"] is False


def test_the_dashboards_list_shape_goes_through_the_same_checks(tmp_path: Path, outside: Path) -> None:
    ckpt = tmp_path / "checkpoint-5"
    ckpt.mkdir()
    (ckpt / "w.bin").write_bytes(b"abc")
    (ckpt / MANIFEST).write_text(json.dumps({"step": 5, "files": [{"path": "w.bin", "size": 3}]}))
    assert checkpoint_info(ckpt)["verified"] is True and checkpoint_info(ckpt)["size_bytes"] == 3
    (ckpt / MANIFEST).write_text(
        json.dumps({"step": 5, "files": [{"path": "w.bin", "size": 3}, {"path": str(outside), "size": 11}]})
    )
    info = checkpoint_info(ckpt)
    assert info["verified"] is False and "outside the checkpoint" in info["problem"]


def test_a_manifest_nested_too_deep_to_parse_is_invalid_not_a_crash(tmp_path: Path) -> None:
    ckpt = _ckpt(tmp_path)
    (ckpt / MANIFEST).write_text('{"files": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert not verify(ckpt).ok and "unreadable" in verify(ckpt).reason
    assert checkpoint_info(ckpt)["verified"] is False

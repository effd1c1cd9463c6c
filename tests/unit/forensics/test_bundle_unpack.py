"""Unpacking a repro bundle is bounded: total bytes, bytes per member, number of members.

A bundle over a limit is refused with a clear error before anything is extracted.
The limits are injected tiny here, so the archives stay small (runs of zeros, which
gzip squeezes to almost nothing).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from steadytune.forensics.unpack import UnpackLimits, opened
from tests.conftest import REPO, STEADYTUNE

TINY = UnpackLimits(max_bytes=10_000, max_member_bytes=4_000, max_members=6)


def bundle(tmp: Path, files: dict[str, int], name: str = "b.tar.gz") -> Path:
    """A .tar.gz with ``bundle.json`` and one member of that many zero bytes per name."""
    out = tmp / name
    with tarfile.open(out, "w:gz") as tar:
        meta = json.dumps({"replay": [{"step": 1}]}).encode()
        for member, data in [("bundle.json", meta), *((n, bytes(size)) for n, size in files.items())]:
            info = tarfile.TarInfo(f"repro-x/{member}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


@pytest.fixture()
def extracted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names tarfile was asked to extract (any extraction call)."""
    calls: list[str] = []
    real_all, real_one = tarfile.TarFile.extractall, tarfile.TarFile.extract

    def spy_all(self: tarfile.TarFile, path: str = ".", members: object = None, **kw: object) -> None:
        calls.append("extractall")
        real_all(self, path, members, **kw)

    def spy_one(self: tarfile.TarFile, member: object, path: str = "", **kw: object) -> None:
        calls.append("extract")
        real_one(self, member, path, **kw)

    monkeypatch.setattr(tarfile.TarFile, "extractall", spy_all)
    monkeypatch.setattr(tarfile.TarFile, "extract", spy_one)
    return calls


def test_a_bundle_within_the_limits_unpacks(tmp_path: Path, extracted: list[str]) -> None:
    with opened(bundle(tmp_path, {"a.bin": 4_000, "b.bin": 3_000}), limits=TINY) as folder:
        assert (folder / "a.bin").stat().st_size == 4_000 and (folder / "bundle.json").exists()


@pytest.mark.parametrize(
    ("files", "says"),
    [
        ({"big.bin": 4_001}, r"big\.bin is 4,001 bytes, over the limit of 4,000 bytes per member"),
        ({f"{i}.bin": 3_000 for i in range(4)}, r"unpacks to more than 10,000 bytes"),
        ({f"{i}.bin": 1 for i in range(6)}, r"more than 6 members"),
    ],
    ids=["member", "total", "count"],
)
def test_a_bundle_over_a_limit_is_refused_before_anything_is_extracted(
    tmp_path: Path, extracted: list[str], files: dict[str, int], says: str
) -> None:
    with pytest.raises(ValueError, match=says), opened(bundle(tmp_path, files), limits=TINY):
        pass
    assert extracted == []


def test_a_member_declaring_a_terabyte_is_refused_at_its_header_with_the_default_limits(
    tmp_path: Path, extracted: list[str]
) -> None:
    info = tarfile.TarInfo("repro-x/huge.bin")
    info.size = 1 << 40  # a header only: the data is not there, and is never read for
    path = tmp_path / "huge.tar.gz"
    path.write_bytes(gzip.compress(info.tobuf(format=tarfile.GNU_FORMAT)))
    with pytest.raises(ValueError, match=r"huge\.bin .* per member"), opened(path):
        pass
    assert extracted == []


def test_not_a_tar_gz_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.tar.gz"
    path.write_bytes(b"not a bundle at all")
    with pytest.raises(ValueError, match=r"not a \.tar\.gz"), opened(path):
        pass


def test_the_cli_takes_the_limits_as_flags(tmp_path: Path) -> None:
    path = bundle(tmp_path, {f"{i}.bin": 10 for i in range(3)})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    for flags, says in (
        (["--max-members", "2"], "more than 2 members"),
        (["--max-member-bytes", "5"], "per member"),
        (["--max-unpacked-bytes", "20"], "unpacks to more than 20 bytes"),
    ):
        proc = subprocess.run(
            [STEADYTUNE, "repro", "--check", str(path), *flags],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert proc.returncode == 1 and says in proc.stderr, proc.stderr

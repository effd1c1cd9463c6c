"""Unpacking a repro bundle is bounded: total bytes, bytes per member, number of members.

A bundle over a limit, or with a member that is not a regular file or a folder, is
refused with a clear error before anything is extracted.
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
import tempfile
from pathlib import Path

import pytest

from steadytune.forensics.unpack import UnpackLimits, opened, unpack
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


def test_a_bundle_within_the_limits_unpacks(tmp_path: Path) -> None:
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
    tmp_path: Path, files: dict[str, int], says: str
) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ValueError, match=says):
        unpack(bundle(tmp_path, files), dest, limits=TINY)
    assert list(dest.iterdir()) == []


def test_a_member_declaring_a_terabyte_is_refused_at_its_header_with_the_default_limits(
    tmp_path: Path,
) -> None:
    info = tarfile.TarInfo("repro-x/huge.bin")
    info.size = 1 << 40  # a header only: the data is not there, and is never read for
    path = tmp_path / "huge.tar.gz"
    path.write_bytes(gzip.compress(info.tobuf(format=tarfile.GNU_FORMAT)))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ValueError, match=r"huge\.bin .* per member"):
        unpack(path, dest)
    assert list(dest.iterdir()) == []


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


def _tar_gz(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    path.write_bytes(gzip.compress(buf.getvalue()))
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    return info


def symlink_chain_bundle(path: Path, dest_len: int) -> Path:
    """CVE-2025-4517: symlinks whose expansion passes PATH_MAX, where ``os.path.realpath`` (and
    so tarfile's ``data`` filter before Python 3.11.13) stops resolving, then a link through
    them to the folder above the destination, and a file written through that link."""
    steps = "abcdefghijklmnop"
    component = "d" * ((os.pathconf("/", "PC_PATH_MAX") - dest_len - 1) // (len(steps) + 1))
    members = [(_member("repro-x/bundle.json"), b"{}")]
    where = ""
    for s in steps:
        members.append((_member(os.path.join(where, component), tarfile.DIRTYPE, mode=0o777), b""))
        members.append((_member(os.path.join(where, s), tarfile.SYMTYPE, component), b""))
        where = os.path.join(where, component)
    long_link = os.path.join(*steps, "l" * 254)
    members.append((_member(long_link, tarfile.SYMTYPE, os.path.join(*[".."] * len(steps))), b""))
    members.append((_member("escape", tarfile.SYMTYPE, os.path.join(long_link, "..")), b""))
    members.append((_member("escape/planted.py", tarfile.REGTYPE), b"print('ran')\n"))
    return _tar_gz(path, members)


def test_a_symlink_chain_longer_than_path_max_writes_nothing_outside_the_folder(tmp_path: Path) -> None:
    """On this machine's Python 3.11.7 the ``data`` filter let this archive write ``planted.py``
    into the folder above the temporary one."""
    outer = tmp_path / "tmp"
    outer.mkdir()
    prefix = "steadytune-repro-"
    path = symlink_chain_bundle(tmp_path / "chain.tar.gz", len(str(outer)) + 1 + len(prefix) + 8)
    saved = tempfile.tempdir
    tempfile.tempdir = str(outer)
    try:
        with pytest.raises(ValueError, match="link"), opened(path):
            pass
    finally:
        tempfile.tempdir = saved
    assert sorted(p.name for p in outer.iterdir()) == []


@pytest.mark.parametrize(
    "member",
    [
        _member("repro-x/inside", tarfile.SYMTYPE, "bundle.json"),
        _member("repro-x/hard", tarfile.LNKTYPE, "repro-x/bundle.json"),
        _member("repro-x/tty", tarfile.CHRTYPE),
        _member("repro-x/pipe", tarfile.FIFOTYPE),
    ],
    ids=["symlink", "hardlink", "device", "fifo"],
)
def test_every_link_device_and_fifo_member_is_refused(tmp_path: Path, member: tarfile.TarInfo) -> None:
    """A bundle needs regular files and folders only: even a link that stays inside is refused."""
    path = _tar_gz(tmp_path / "b.tar.gz", [(_member("repro-x/bundle.json"), b"{}"), (member, b"")])
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ValueError, match=f"{member.name} is a .*regular files and folders only"):
        unpack(path, dest)
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("../evil.py", "no '..'"),
        ("/tmp/evil.py", "relative paths"),
        ("repro-x/../../evil.py", "no '..'"),
        ("repro-x\\..\\evil.py", "backslash"),
        ("repro-x/bundle.json", "appears twice"),
        ("repro-x/" + "d" * 300 + "/x", "cannot be unpacked into"),  # found by the fuzzing harness: OSError
    ],
)
def test_a_member_path_outside_the_folder_or_given_twice_is_refused(
    tmp_path: Path, name: str, says: str
) -> None:
    path = _tar_gz(tmp_path / "b.tar.gz", [(_member("repro-x/bundle.json"), b"{}"), (_member(name), b"x")])
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ValueError, match=says):
        unpack(path, dest)
    assert list(dest.iterdir()) == []
    assert not (tmp_path / "evil.py").exists()

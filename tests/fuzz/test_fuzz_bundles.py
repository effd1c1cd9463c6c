"""Repro bundles: any ``.tar.gz`` is unpacked inside its folder, regular files only, or refused.

Documented clean error: ``ValueError`` from :func:`~steadytune.forensics.unpack.unpack`, which
also means nothing was written. Whatever the archive, nothing appears outside the destination
and no link, device or FIFO inside it.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from steadytune.forensics.unpack import UnpackLimits, unpack
from tests.fuzz.conftest import cases

LIMITS = UnpackLimits(max_bytes=20_000, max_member_bytes=8_000, max_members=12)
TYPES = [
    tarfile.REGTYPE,
    tarfile.AREGTYPE,
    tarfile.DIRTYPE,
    tarfile.SYMTYPE,
    tarfile.LNKTYPE,
    tarfile.CHRTYPE,
    tarfile.BLKTYPE,
    tarfile.FIFOTYPE,
    tarfile.CONTTYPE,
    b"Z",
]
parts = st.sampled_from(
    ["repro-x", "..", ".", "", "a", "bundle.json", "d" * 200, "x\\y", "é", "\x00"]
) | st.text(max_size=6)
names = st.one_of(
    st.lists(parts, min_size=1, max_size=5).map("/".join),
    st.sampled_from(["/etc/evil", "../evil", "repro-x/../../evil", "repro-x/bundle.json", "repro-x//x"]),
)
members = st.tuples(names, st.sampled_from(TYPES), st.binary(max_size=300), names)


def _archive(items: list[tuple[str, bytes, bytes, str]], fmt: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, kind, data, link in [("repro-x/bundle.json", tarfile.REGTYPE, b"{}", ""), *items]:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            regular = kind in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
            info.size = len(data) if regular else 0
            tar.addfile(info, io.BytesIO(data) if regular else None)
    return buf.getvalue()


# Regular files and folders under the bundle's folder: these get past the header checks to the writing.
plain_part = st.sampled_from(["repro-x", "data", "checkpoint", "a.json", "b"]) | st.text(
    min_size=1, max_size=8
)
plain_names = st.lists(plain_part, min_size=1, max_size=4).map(lambda p: "repro-x/" + "/".join(p))
plain_kinds = st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE])
plain = st.tuples(plain_names, plain_kinds, st.binary(max_size=300), st.just(""))
archives = st.one_of(
    st.builds(_archive, st.lists(plain, max_size=6), st.just(tarfile.PAX_FORMAT)),
    st.builds(
        _archive, st.lists(members, max_size=6), st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
    ),
    st.binary(max_size=600),
)


@cases(120)
@given(archives, st.sampled_from(["gzip", "raw", "cut"]), st.data())
def test_any_archive_unpacks_inside_as_regular_files_or_is_refused(
    tmp_path_factory: pytest.TempPathFactory, raw: bytes, how: str, data: st.DataObject
) -> None:
    if how == "gzip":
        blob = gzip.compress(raw)
    elif how == "cut":
        whole = gzip.compress(raw)
        blob = whole[: data.draw(st.integers(0, len(whole)))]
    else:
        blob = raw
    root = tmp_path_factory.mktemp("b")
    (root / "bundle.tar.gz").write_bytes(blob)
    dest = root / "dest"
    dest.mkdir()
    try:
        top = unpack(root / "bundle.tar.gz", dest, LIMITS)
    except ValueError as exc:
        assert str(exc)
        event("refused: ValueError")
        assert sorted(p.name for p in root.iterdir()) == ["bundle.tar.gz", "dest"]
        return
    event("unpacked")
    assert top.is_relative_to(dest)
    assert sorted(p.name for p in root.iterdir()) == ["bundle.tar.gz", "dest"]
    for folder, dirs, files in os.walk(dest):
        for name in dirs + files:
            path = os.path.join(folder, name)
            assert not os.path.islink(path), path
            assert os.path.isdir(path) or os.path.isfile(path), path

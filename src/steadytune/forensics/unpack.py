"""Unpacking a repro bundle safely: size, member and path limits checked before anything is written."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Unpacking limits for a ``.tar.gz`` bundle (``repro --check --max-unpacked-bytes/--max-member-bytes/
# --max-members``). A default bundle is a few hundred KiB; one with ``--include-checkpoint`` of a
# full fine-tune holds the weights and the optimizer state, so pass larger limits for those.
MAX_UNPACKED_BYTES = 32 * 1024**3
MAX_MEMBER_BYTES = 16 * 1024**3
MAX_MEMBERS = 10_000
_HEADER_ALLOWANCE = 8 * 1024  # tar stream bytes per member beyond its data: headers, long names, padding


@dataclass(frozen=True)
class UnpackLimits:
    """What unpacking one bundle may take: bytes in all, bytes per member, members."""

    max_bytes: int = MAX_UNPACKED_BYTES
    max_member_bytes: int = MAX_MEMBER_BYTES
    max_members: int = MAX_MEMBERS

    @property
    def stream_bytes(self) -> int:
        """The most decompressed tar stream that can hold a bundle within the limits."""
        return self.max_bytes + (self.max_members + 2) * _HEADER_ALLOWANCE


class _Capped:
    """A read-only file that refuses to read or seek past ``cap`` bytes (no decompression bomb,
    not even in headers tarfile reads whole)."""

    def __init__(self, f: Any, cap: int, what: str) -> None:
        self._f, self._cap, self._what = f, cap, what

    def _refuse(self) -> None:
        raise ValueError(
            f"{self._what} unpacks to more than {self._cap:,} bytes of tar stream; refused before extracting "
            "(raise --max-unpacked-bytes / --max-members if you trust it)"
        )

    def read(self, n: int = -1) -> bytes:
        pos = self._f.tell()
        if n is None or n < 0:
            n = self._cap - pos + 1
        if pos + n > self._cap:
            data = self._f.read(max(self._cap - pos, 0) + 1)
            if pos + len(data) > self._cap:
                self._refuse()
            return data
        return bytes(self._f.read(n))

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset if whence == 0 else self._f.tell() + offset if whence == 1 else None
        if target is None or target > self._cap:
            self._refuse()
        return int(self._f.seek(target))

    def tell(self) -> int:
        return int(self._f.tell())


def check_members(tar: tarfile.TarFile, limits: UnpackLimits, dest: str, what: str) -> list[tarfile.TarInfo]:
    """Every member of ``tar``, read from the headers only, once each passed the limits and the
    ``data`` extraction filter (no absolute path, no ``..``, no link out, no device file).

    Raises:
        ValueError: the first limit or rule a member breaks, before anything is extracted.
    """
    members: list[tarfile.TarInfo] = []
    total = 0
    while True:
        member = tar.next()
        if member is None:
            return members
        if len(members) >= limits.max_members:
            raise ValueError(
                f"{what} has more than {limits.max_members:,} members; refused before extracting "
                "(--max-members raises the limit)"
            )
        if member.size > limits.max_member_bytes:
            raise ValueError(
                f"{what}: {member.name} is {member.size:,} bytes, over the limit of "
                f"{limits.max_member_bytes:,} bytes per member; refused before extracting "
                "(--max-member-bytes raises it)"
            )
        total += member.size
        if total > limits.max_bytes:
            raise ValueError(
                f"{what} unpacks to more than {limits.max_bytes:,} bytes; refused before extracting "
                "(--max-unpacked-bytes raises the limit)"
            )
        try:
            tarfile.data_filter(member, dest)
        except tarfile.FilterError as exc:
            raise ValueError(f"{what}: unsafe member refused before extracting: {exc}") from None
        members.append(member)


@contextlib.contextmanager
def opened(bundle: Path, limits: UnpackLimits | None = None) -> Iterator[Path]:
    """The bundle's folder: as is, or a ``.tar.gz`` unpacked into a temporary folder, safely.

    Safely: every member is checked first, from its header (the limits, and tarfile's
    ``data`` filter), and only then is anything extracted.
    """
    bundle = Path(bundle)
    limits = limits or UnpackLimits()
    if bundle.is_dir():
        yield bundle
        return
    if not bundle.is_file():
        raise FileNotFoundError(
            f"{bundle} does not exist; pass a repro bundle (.tar.gz) or its unpacked folder"
        )
    with tempfile.TemporaryDirectory(prefix="steadytune-repro-") as tmp:
        try:
            with (
                gzip.open(bundle, "rb") as gz,
                # _Capped is a read-only file object: tarfile reads it, nothing more.
                tarfile.open(fileobj=_Capped(gz, limits.stream_bytes, str(bundle)), mode="r:") as tar,  # type: ignore[call-overload]
            ):
                members = check_members(tar, limits, tmp, str(bundle))
                need, free = sum(m.size for m in members), shutil.disk_usage(tmp).free
                if need > free:
                    raise ValueError(
                        f"{bundle} unpacks to {need:,} bytes, {tmp} has {free:,} free; set TMPDIR to a "
                        "larger disk or pass the unpacked folder"
                    )
                tar.extractall(tmp, members=members, filter="data")
        except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise ValueError(f"{bundle} is not a .tar.gz repro bundle, or it is damaged: {exc}") from None
        tops = [p for p in Path(tmp).iterdir() if (p / "bundle.json").exists()]
        if not tops:
            raise ValueError(f"{bundle} holds no bundle.json: not a steadytune repro bundle")
        yield tops[0]


class UnsafeBundle(ValueError):
    """A bundle that asks for something ``repro --check`` does not do for a stranger's file."""


def size(text: str) -> int:
    """A byte count from the command line: ``64GiB``, ``500MB``, ``1000``."""
    from steadytune.units import parse_bytes

    return parse_bytes(text)


def add_limit_flags(ap: argparse.ArgumentParser) -> None:
    """The unpacking limits as flags (``repro --check`` and ``replay.py``)."""
    ap.add_argument(
        "--max-unpacked-bytes",
        type=size,
        default=MAX_UNPACKED_BYTES,
        metavar="SIZE",
        help="refuse a .tar.gz bundle that unpacks to more (default 32GiB)",
    )
    ap.add_argument(
        "--max-member-bytes",
        type=size,
        default=MAX_MEMBER_BYTES,
        metavar="SIZE",
        help="refuse a .tar.gz bundle with a larger file in it (default 16GiB)",
    )
    ap.add_argument(
        "--max-members",
        type=int,
        default=MAX_MEMBERS,
        metavar="N",
        help="refuse a .tar.gz bundle with more files (default 10000)",
    )

"""Unpacking a repro bundle safely: size, member and path limits checked before anything is written,
then the regular files written by steadytune itself, never through a link."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import shutil
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steadytune.scratch import owned_tempdir_for

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


def _short(name: str) -> str:
    """A member's name or link fit for a message: an archive may make either thousands of bytes long."""
    return name if len(name) <= 120 else f"{name[:60]}...{name[-40:]}"


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"a symbolic link (to {_short(member.linkname)!r})"
    if member.islnk():
        return f"a hard link (to {_short(member.linkname)!r})"
    if member.ischr() or member.isblk():
        return "a device file"
    if member.isfifo():
        return "a FIFO"
    return f"an entry of tar type {member.type!r}"


def _parts(member: tarfile.TarInfo, what: str) -> tuple[str, ...]:
    """The path of a member as folder names under the destination; a ValueError for any other."""
    name = member.name
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if name.startswith("/") or "\\" in name or "\x00" in name or ".." in parts or not parts:
        raise ValueError(
            f"{what}: unsafe member {_short(name)!r} refused before extracting: a bundle's members are "
            "relative paths with no '..', backslash or NUL"
        )
    return parts


def check_members(tar: tarfile.TarFile, limits: UnpackLimits, what: str) -> list[tarfile.TarInfo]:
    """Every member of ``tar``, read from the headers only, once each passed the limits and the rules:
    regular files and folders only (a bundle needs no link, device or FIFO, so none is taken, even
    one that stays inside), relative paths without ``..``, each name once.

    Raises:
        ValueError: the first limit or rule a member breaks, before anything is extracted.
    """
    members: list[tarfile.TarInfo] = []
    seen: set[tuple[str, ...]] = set()
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
                f"{what}: {_short(member.name)} is {member.size:,} bytes, over the limit of "
                f"{limits.max_member_bytes:,} bytes per member; refused before extracting "
                "(--max-member-bytes raises it)"
            )
        total += member.size
        if total > limits.max_bytes:
            raise ValueError(
                f"{what} unpacks to more than {limits.max_bytes:,} bytes; refused before extracting "
                "(--max-unpacked-bytes raises the limit)"
            )
        if not (member.isreg() or member.isdir()):
            raise ValueError(
                f"{what}: {_short(member.name)} is {_kind(member)}; a bundle holds regular files and folders "
                "only, so it is refused before extracting"
            )
        parts = _parts(member, what)
        if parts in seen and not member.isdir():
            raise ValueError(f"{what}: {_short(member.name)} appears twice; refused before extracting")
        seen.add(parts)
        members.append(member)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def _enter(parent: int, name: str) -> int:
    """The folder ``name`` in the folder ``parent`` (made if missing), opened without following a link."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass
    return os.open(name, _DIR_FLAGS, dir_fd=parent)


def extract(tar: tarfile.TarFile, members: list[tarfile.TarInfo], dest: Path, what: str) -> None:
    """Write ``members`` (already checked) under ``dest`` ourselves, whatever the Python version.

    Every folder is entered by a descriptor opened with ``O_NOFOLLOW`` relative to the one above
    it, and every file is created new (``O_EXCL | O_NOFOLLOW``), so nothing is written through a
    link and nothing lands outside ``dest``: tarfile's ``data`` filter relied on ``realpath``,
    which stops resolving past ``PATH_MAX`` (CVE-2025-4517, fixed only in Python 3.11.13).
    """
    root = os.open(dest, _DIR_FLAGS)
    try:
        for member in members:
            parts = _parts(member, what)
            fds = [root]
            try:
                for folder in parts[:-1] if member.isreg() else parts:
                    fds.append(_enter(fds[-1], folder))
                if member.isreg():
                    _write(tar, member, parts[-1], fds[-1], what)
            finally:
                for fd in fds[1:]:
                    os.close(fd)
    finally:
        os.close(root)


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, name: str, parent: int, what: str) -> None:
    src = tar.extractfile(member)
    if src is None:
        raise ValueError(f"{what}: {_short(member.name)} has no data to extract")
    fd = os.open(name, _NEW_FILE, 0o600, dir_fd=parent)
    with os.fdopen(fd, "wb") as out:
        left = member.size
        while left > 0:
            chunk = src.read(min(left, 1 << 20))
            if not chunk:
                raise ValueError(f"{what}: {_short(member.name)} ends before its {member.size:,} bytes")
            out.write(chunk)
            left -= len(chunk)


def unpack(bundle: Path, dest: Path, limits: UnpackLimits | None = None) -> Path:
    """Unpack the ``.tar.gz`` ``bundle`` into the (empty) folder ``dest``; the folder holding its
    ``bundle.json``.

    Every member is checked first, from its header (the limits, regular files and folders only,
    relative paths), and only then is anything written (see :func:`extract`).

    Raises:
        ValueError: the bundle breaks a limit or a rule, or is not a ``.tar.gz`` bundle.
    """
    limits = limits or UnpackLimits()
    try:
        with (
            gzip.open(bundle, "rb") as gz,
            # _Capped is a read-only file object: tarfile reads it, nothing more.
            tarfile.open(fileobj=_Capped(gz, limits.stream_bytes, str(bundle)), mode="r:") as tar,  # type: ignore[call-overload]
        ):
            members = check_members(tar, limits, str(bundle))
            need, free = sum(m.size for m in members), shutil.disk_usage(dest).free
            if need > free:
                raise ValueError(
                    f"{bundle} unpacks to {need:,} bytes, {dest} has {free:,} free; set TMPDIR to a "
                    "larger disk or pass the unpacked folder"
                )
            try:
                extract(tar, members, dest, str(bundle))
            except OSError as exc:  # a name this file system cannot hold, a full disk
                for made in dest.iterdir():  # dest was empty: leave it so
                    shutil.rmtree(made) if made.is_dir() and not made.is_symlink() else made.unlink()
                raise ValueError(f"{bundle} cannot be unpacked into {dest}: {exc}") from None
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise ValueError(f"{bundle} is not a .tar.gz repro bundle, or it is damaged: {exc}") from None
    tops = [p for p in dest.iterdir() if (p / "bundle.json").is_file()]
    if not tops:
        raise ValueError(f"{bundle} holds no bundle.json: not a steadytune repro bundle")
    return tops[0]


@contextlib.contextmanager
def opened(bundle: Path, limits: UnpackLimits | None = None) -> Iterator[Path]:
    """The bundle's folder: as is, or a ``.tar.gz`` unpacked (:func:`unpack`) into a temporary folder."""
    bundle = Path(bundle)
    if bundle.is_dir():
        yield bundle
        return
    if not bundle.is_file():
        raise FileNotFoundError(
            f"{bundle} does not exist; pass a repro bundle (.tar.gz) or its unpacked folder"
        )
    with owned_tempdir_for("steadytune-repro-") as tmp:
        yield unpack(bundle, Path(tmp), limits)


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

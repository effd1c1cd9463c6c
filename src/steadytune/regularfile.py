"""Opening a file that someone else may have put there: the one opener for run-folder files and logs.

Whoever can write a run folder (or hand ``analyze`` a path) can put anything where a file is
expected: a FIFO (opening it waits for a writer that never comes, and a thread or a whole
command with it), a link to ``/dev/zero`` (a read that never ends), a folder. So a reader
opens with ``O_NONBLOCK`` (opening a FIFO returns at once), ``fstat``s the descriptor it holds
(no swap between a check and the open can slip past) and refuses anything but a regular file
with :class:`NotRegularFile`, an ``OSError``: every reader's existing "cannot be read" path
takes it as it takes a missing file. ``O_NONBLOCK`` is cleared again before the file is
returned; on a regular file it changes nothing, but the descriptor is then as ``open()``
makes it.

A whole-file read (:func:`read_bytes`, :func:`read_text`) is bounded too: a regular file can
still grow without end while it is read, and a JSON file of ours is kilobytes.

Torch-free, stdlib only: the supervisor, the web server and the importers use it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import IO, Any

# status.json, a manifest, a summary: kilobytes. A plan or a stored summary of a long run: a few MB.
MAX_FILE_BYTES = 64 << 20

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


class NotRegularFile(OSError):
    """A path that is a FIFO, a device, a socket or a folder where a file was expected."""


class FileTooLarge(OSError):
    """A file read whole that is larger than the bound its reader set."""


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words, for an error message."""
    return next((name for test, name in _KINDS if test(mode)), "something else")


def not_a_file(path: Path | str) -> str:
    """What ``path`` is, said after its name, when it is not a regular file: missing, a FIFO, a
    folder, ... (a FIFO or a folder in a file's place read "does not exist")."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "does not exist"
    except (OSError, ValueError) as exc:  # a name too long, a NUL in it
        return f"cannot be read ({getattr(exc, 'strerror', None) or exc})"
    if stat.S_ISREG(mode):
        return "is a regular file"
    return f"is {kind_of(mode)}, not a regular file"


def _regular_only(fd: int, path: Path | str) -> int:
    """``fd`` if it is a regular file, made blocking again as ``open()`` makes it; else closed and refused."""
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, f"{kind_of(mode)}, not a regular file", str(path))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_fd(path: Path | str, *, follow: bool = True) -> int:
    """A descriptor of the regular file at ``path``, open for reading, that never blocked.

    ``follow=False`` refuses a symlink as the last part of the path too (``ELOOP``).

    Raises:
        NotRegularFile: ``path`` is a FIFO, a device, a socket or a folder.
        OSError: it cannot be opened (missing, no permission, a link when ``follow`` is False).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    return _regular_only(fd, path)


def append_fd(path: Path | str) -> int:
    """A descriptor of the regular file at ``path`` open for appending (made if missing), that never blocked.

    Opening a FIFO to write waits for a reader; with ``O_NONBLOCK`` it fails at once (``ENXIO``) when
    none is there, and is refused by its kind when one is: a co-writer who puts a FIFO where a log is
    written gets an error at the next write, not a writer stuck for good.

    Raises:
        NotRegularFile: ``path`` is a FIFO, a device, a socket or a folder.
        OSError: it cannot be opened or made.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO (or a device) with no reader on its other end
            raise NotRegularFile(errno.EINVAL, "a FIFO or a device, not a regular file", str(path)) from e
        raise
    return _regular_only(fd, path)


def open_regular(path: Path | str, mode: str = "r", *, follow: bool = True, **kwargs: Any) -> IO[Any]:
    """``open(path, mode, **kwargs)`` for reading, that refuses what :func:`open_fd` refuses."""
    if any(c in mode for c in "wax+"):
        raise ValueError(f"open_regular reads only; mode {mode!r}")
    return open(open_fd(path, follow=follow), mode, **kwargs)


def read_bytes(path: Path | str, limit: int = MAX_FILE_BYTES, *, follow: bool = True) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    Raises:
        FileTooLarge: it holds more than ``limit`` bytes (read no further than that).
        NotRegularFile, OSError: as :func:`open_fd`.
    """
    with open_regular(path, "rb", follow=follow) as f:
        # Asked for what the file holds, not for the bound: read(n) makes an n-byte buffer first, and
        # 64 MiB a call made a 100-byte status.json cost 7x its read. A file still growing is read on.
        want = min(os.fstat(f.fileno()).st_size, limit) + 1
        chunks: list[bytes] = []
        total = 0
        while chunk := f.read(want):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise FileTooLarge(errno.EFBIG, f"is larger than {limit:,} bytes", str(path))
            want = min(1 << 20, limit + 1 - total)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_text(path: Path | str, limit: int = MAX_FILE_BYTES, *, follow: bool = True) -> str:
    """The UTF-8 text of the regular file at ``path``; as :func:`read_bytes`, and ``UnicodeDecodeError``
    (a ``ValueError``) when it is not UTF-8."""
    return read_bytes(path, limit, follow=follow).decode("utf-8")

"""Temporary folders that a killed owner does not leave behind for good.

``tempfile.TemporaryDirectory`` removes its folder when the ``with`` ends, an exception or
SIGTERM included, but a SIGKILL (an OOM kill, ``kill -9``) runs no Python: the folder, up to
4 GiB for an unpacked log, stays until someone notices. So each folder made here names its
owner, ``<prefix><pid>-<start>-<ns>-<random>``, where ``<start>`` is the process's start time in
clock ticks since boot (``/proc/<pid>/stat``) and ``<ns>`` its pid namespace; the next
:func:`owned_tempdir` of the same prefix removes the folders whose owner is gone. A pid alone is
not enough: pids are reused, and a folder whose pid now belongs to another process would be kept
for as long as that one lives; a process's start time does not change, so pid and start time
together name one process. A folder made in another pid namespace (another container sharing
the temporary folder) names a pid this process cannot look up: it is left alone.

Where the start time cannot be read (no ``/proc``), the folder is named with the pid alone and
swept only when no process has that pid.

A folder its owner has not removed by the time it exits (a SIGTERM raised between the making of
the folder and the ``try`` meant to remove it) is removed at that exit: each is recorded before
it is made.
"""

from __future__ import annotations

import atexit
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_UNKNOWN = "x"  # the start time of a process whose /proc entry could not be read


def started(pid: int, proc: Path = Path("/proc")) -> str | None:
    """Process ``pid``'s start time as ``/proc/<pid>/stat`` gives it (clock ticks since boot);
    None if there is no such process, ``"x"`` where ``/proc`` cannot say."""
    try:
        raw = (proc / str(pid) / "stat").read_bytes()
    except FileNotFoundError:
        return None if proc.is_dir() else (_UNKNOWN if _exists(pid) else None)
    except OSError:
        return _UNKNOWN if _exists(pid) else None
    # The name (field 2) may hold spaces and parentheses: the fields after it follow the last ")".
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[19].decode() if len(fields) > 19 else _UNKNOWN


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # a pid past a C long names no process
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def namespace(proc: Path = Path("/proc")) -> str:
    """This process's pid namespace (the inode of ``/proc/self/ns/pid``), ``"x"`` where unknown."""
    try:
        return str(os.stat(proc / "self" / "ns" / "pid").st_ino)
    except OSError:
        return _UNKNOWN


def owner_gone(name: str, prefix: str, proc: Path = Path("/proc")) -> bool:
    """Whether the folder ``name`` made by :func:`owned_tempdir` with ``prefix`` has lost its owner.
    A name of another shape, or from another pid namespace, is never gone (not ours to judge)."""
    found = re.fullmatch(re.escape(prefix) + r"(\d+)-(\d+|x)-(\d+|x)-\w+", name)
    if found is None or found[3] != namespace(proc):
        return False
    pid, start = int(found[1]), found[2]
    now = started(pid, proc)
    if now is None:
        return True
    return start != _UNKNOWN and now != _UNKNOWN and now != start


def sweep(prefix: str, where: Path | None = None, proc: Path = Path("/proc")) -> list[Path]:
    """Remove this user's folders of ``prefix`` in ``where`` (the temporary folder) whose owner is
    gone; the folders removed."""
    root = Path(where if where is not None else tempfile.gettempdir())
    uid = os.getuid() if hasattr(os, "getuid") else None
    try:
        # Walked, not listed: anyone can fill a shared /tmp, and a list of its 1,000,000 entries
        # held ~230 MB on every sweep, where the folders to remove are a handful.
        with os.scandir(root) as entries:
            dead = [Path(e.path) for e in entries if _gone(e, prefix, uid, proc)]
    except OSError:
        return []
    for path in dead:
        shutil.rmtree(path, ignore_errors=True)
    return dead


def _gone(entry: os.DirEntry[str], prefix: str, uid: int | None, proc: Path) -> bool:
    """Whether ``entry`` is a folder of ``prefix`` of this user (not a link) whose owner is gone."""
    if not entry.name.startswith(prefix):
        return False
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    mine = stat.S_ISDIR(st.st_mode) and (uid is None or st.st_uid == uid)
    return mine and owner_gone(entry.name, prefix, proc)


# This process's folders, each recorded (with the pid that made it: a forked child inherits the
# record, not the folder) before it exists, and removed at exit if still there.
_MADE: dict[Path, int] = {}
_AT_EXIT: list[bool] = []


def _new_name(prefix: str, where: Path | None) -> Path:
    """A name for a new folder of this process, recorded for removal at its exit; not made yet.

    Recorded first: a stop raised between any two lines (SIGTERM and Ctrl-C are raised as
    exceptions where the code is) then leaves no folder that neither its ``with`` nor the exit
    removes. ``mkdtemp`` made the folder before its caller could see its name."""
    sweep(prefix, where)
    pid = os.getpid()
    owner = f"{pid}-{started(pid) or _UNKNOWN}-{namespace()}"
    if not _AT_EXIT:
        _AT_EXIT.append(True)
        atexit.register(remove_own)
    # Absolute, as mkdtemp's were: a chdir before the exit must not aim the removal elsewhere.
    root = Path(os.path.abspath(where if where is not None else tempfile.gettempdir()))
    path = root / f"{prefix}{owner}-{secrets.token_hex(4)}"
    _MADE[path] = pid
    return path


def _make(path: Path, prefix: str, where: Path | None) -> Path:
    """``path`` made (only its owner may enter it), or another new name where ``path`` is taken."""
    while True:
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            path = _new_name(prefix, where)


def owned_tempdir(prefix: str, where: Path | None = None) -> Path:
    """A new folder in the temporary folder (or ``where``) named for this process; the folders of
    ``prefix`` that dead owners left are removed first. The caller removes its own when done
    (:func:`remove`); what it has not removed by the time this process exits is removed then."""
    return _make(_new_name(prefix, where), prefix, where)


def remove(path: Path) -> None:
    """Remove a folder of :func:`owned_tempdir`, and its record."""
    shutil.rmtree(path, ignore_errors=True)
    _MADE.pop(path, None)


def remove_own() -> list[Path]:
    """Remove the folders this process made that are still there (run at its exit); those removed."""
    pid = os.getpid()
    mine = [path for path, maker in list(_MADE.items()) if maker == pid]
    removed = [path for path in mine if os.path.lexists(path)]
    for path in mine:
        remove(path)
    return removed


@contextmanager
def owned_tempdir_for(prefix: str, where: Path | None = None) -> Iterator[Path]:
    """:func:`owned_tempdir` for the length of a ``with``: removed when it ends, however it ends,
    short of a kill that runs no code (the next one of ``prefix`` then removes it)."""
    path = _new_name(prefix, where)
    try:  # from before the folder exists: a stop at any line after the name is known removes it
        path = _make(path, prefix, where)
        yield path
    finally:
        remove(path)

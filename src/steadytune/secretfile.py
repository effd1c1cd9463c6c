"""Files and folders that hold a secret (``token_file``, ``password_file``, ``url_file``, the audit
key, the server's queue).

A secret file is read only if its owner alone may use it: a file the group or other
users can read (or write) is refused with a message that names it, its mode and the
fix (``chmod 600 FILE``). The mode is checked on the opened file, so a swap between
the check and the read cannot slip past it. On Windows, where POSIX modes mean
nothing, no mode is checked. What steadytune itself writes that may hold a secret is created
private (:func:`private_files`) in a folder only its owner may use (:func:`private_dir`).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

GROUP_OTHER = 0o077


class InsecureSecretFile(ValueError):
    """A secret file the group or other users may read or write; the message says how to fix it."""


def mode_problem(path: Path, mode: int) -> str | None:
    """Why ``mode`` is too open for a secret file, or ``None`` if it is fine."""
    if os.name == "nt" or not mode & GROUP_OTHER:
        return None
    perms = stat.S_IMODE(mode)
    who = " and ".join(w for w, bits in (("group", 0o070), ("other users", 0o007)) if mode & bits)
    return (
        f"{path} is mode {perms:03o}: its {who} may read or change it, and it holds a secret. "
        f"Run `chmod 600 {path}`"
    )


def read_secret_file(path: Path | str) -> str:
    """The stripped UTF-8 text of a secret file; :class:`InsecureSecretFile` if others may use it.

    ``OSError`` (missing, unreadable) and ``UnicodeDecodeError`` pass through, for the
    caller to word.
    """
    path = Path(path).expanduser()
    with open(path, "rb") as f:
        problem = mode_problem(path, os.fstat(f.fileno()).st_mode)
        if problem:
            raise InsecureSecretFile(problem)
        return f.read().decode("utf-8").strip()


class InsecureDirectory(ValueError):
    """A folder for secrets that another user owns; the message says which and what to do."""


@contextlib.contextmanager
def private_files() -> Iterator[None]:
    """Files created inside are the owner's alone from their first byte (umask 077).

    For what SQLite creates beside a database (``-wal``, ``-shm``, a journal), which a chmod
    after the fact would leave readable until then. The umask is the process's: a file another
    thread creates meanwhile comes out private too, never more open.
    """
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def private_dir(path: Path, what: str) -> str | None:
    """Make ``path`` a folder only its owner may use, or check that it is one.

    A missing folder is made mode 700. An existing one this user owns whose group or other users
    may use it is made 700, and the reason is returned for the caller to tell (``None`` when
    nothing was changed). POSIX only; on Windows nothing is checked.

    Raises:
        InsecureDirectory: the folder is a link, not a folder, or owned by another user.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if os.name == "nt":
        return None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise InsecureDirectory(
            f"{what} {path} is not a folder (a link or a file); point it at a folder of your own"
        )
    if st.st_uid != os.getuid():
        raise InsecureDirectory(
            f"{what} {path} belongs to another user (uid {st.st_uid}), and it will hold secrets; "
            "use a folder of your own"
        )
    mode = stat.S_IMODE(st.st_mode)
    if not mode & GROUP_OTHER:
        return None
    os.chmod(path, 0o700)
    return (
        f"{what} {path} was mode {mode:03o}, so other users could read what it holds (job environments, "
        "tokens); made 700"
    )

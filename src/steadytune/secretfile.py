"""Files that hold a secret (``token_file``, ``password_file``, ``url_file``, the audit key).

Such a file is read only if its owner alone may use it: a file the group or other
users can read (or write) is refused with a message that names it, its mode and the
fix (``chmod 600 FILE``). The mode is checked on the opened file, so a swap between
the check and the read cannot slip past it. On Windows, where POSIX modes mean
nothing, no mode is checked.
"""

from __future__ import annotations

import os
import stat
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

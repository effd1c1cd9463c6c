"""The git state of the user's working tree: commit, branch, and the uncommitted diff.

What ``env.json`` records so that "which code was this?" has an answer. The diff is
bounded (:data:`MAX_DIFF_BYTES`; its full size and sha256 are kept, so two runs can
still be told apart) and never carries a secret: a file whose name looks secret is
left out, and the rest goes through :func:`steadytune.redact.redact_text` (values given
to secret-looking keys, tokens of the well-known shapes, credentials in URLs). Torch-free;
``git`` is run as a subprocess, and a machine or a folder without it gives ``None``, not
an exception.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from steadytune.redact import redact_text

MAX_DIFF_BYTES = 64 * 1024
GIT_TIMEOUT_S = 10.0

# Files that hold credentials by convention: their diff is never recorded, only their name.
SECRET_FILES = re.compile(
    r"(^|/)(\.env(\..*)?|.*\.pem|.*\.key|id_rsa.*|id_ed25519.*|\.netrc|\.npmrc|\.pypirc|credentials.*|secrets?\..*)$",
    re.IGNORECASE,
)

Runner = Callable[[Sequence[str], Path], "str | None"]


def run_git(args: Sequence[str], cwd: Path) -> str | None:
    """``git ARGS`` in ``cwd``: its stdout, or None when git is missing or the command fails."""
    exe = shutil.which("git")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, *args], cwd=cwd, capture_output=True, timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.decode("utf-8", "replace")


def split_diff(diff: str) -> list[tuple[str, str]]:
    """A unified diff cut into ``(path, section)`` per file, in order."""
    out: list[tuple[str, str]] = []
    for part in re.split(r"(?m)^(?=diff --git )", diff):
        if not part:
            continue
        m = re.match(r"diff --git a/(\S+) b/(\S+)", part)
        out.append((m.group(2) if m else "", part))
    return out


def redact_diff(diff: str) -> str:
    """A diff safe to keep: secret files reduced to their name, secret values masked."""
    parts = []
    for path, section in split_diff(diff):
        if path and SECRET_FILES.search(path):
            parts.append(
                f"diff --git a/{path} b/{path}\n(changes to a file that may hold secrets are not recorded)\n"
            )
        else:
            parts.append(redact_text(section))
    return "".join(parts)


def bounded(text: str, limit: int = MAX_DIFF_BYTES) -> tuple[str, bool]:
    """``text`` cut at ``limit`` UTF-8 bytes (on a line boundary when there is one), and whether it was
    cut."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text, False
    cut = raw[:limit].decode("utf-8", "ignore")
    nl = cut.rfind("\n")
    return (cut[: nl + 1] if nl > 0 else cut), True


def git_state(
    sources: Sequence[Path], git: Runner = run_git, limit: int = MAX_DIFF_BYTES
) -> dict[str, Any] | None:
    """The state of the first git working tree that holds one of ``sources`` (files or folders).

    Returns:
        ``{root, commit, branch, remote, dirty, diff, diff_bytes, diff_sha256,
        diff_truncated, untracked}``, or None when none of them is in a working tree.
        ``branch`` is None on a detached HEAD; ``diff`` is ``git diff HEAD`` (staged and
        unstaged changes to tracked files), redacted, then bounded.
    """
    for src in sources:
        folder = src if src.is_dir() else src.parent
        if not folder.is_dir():
            continue
        root = git(["rev-parse", "--show-toplevel"], folder)
        if root is None or not root.strip():
            continue
        top = Path(root.strip())
        commit = (git(["rev-parse", "HEAD"], top) or "").strip() or None  # None: a repository without commits
        branch = (git(["symbolic-ref", "--quiet", "--short", "HEAD"], top) or "").strip() or None
        remote = (git(["config", "--get", "remote.origin.url"], top) or "").strip() or None
        raw = git(["diff", "HEAD", "--no-color", "--no-ext-diff"], top) if commit else None
        diff = redact_diff(raw or "")
        kept, truncated = bounded(diff, limit)
        status = git(["status", "--porcelain", "--untracked-files=normal"], top) or ""
        untracked = sum(1 for line in status.splitlines() if line.startswith("??"))
        return {
            "root": str(top),
            "commit": commit,
            "branch": branch,
            "remote": redact_text(remote) if remote else None,
            "dirty": bool(status.strip()),
            "diff": kept,
            "diff_bytes": len(diff.encode("utf-8")),
            "diff_sha256": hashlib.sha256(diff.encode("utf-8")).hexdigest() if diff else None,
            "diff_truncated": truncated,
            "untracked": untracked,
        }
    return None

"""What the dashboard derived from a finished run, kept on disk beside the run.

A dashboard that starts over a runs folder of a thousand finished runs would otherwise read
every one of them again (its index, its events, every line of its telemetry for the goodput
account) before its first ``/metrics`` scrape or runs page could answer: 29 s for 100 runs of
2,000 steps. What it derived from a run whose supervisor is gone is written once to
:data:`NAME` in the run's folder (or the dashboard's cache, when the folder is not writable),
each value with the stamps of the files it was derived from, and read back by the next
dashboard as long as those files are unchanged: ``(mtime in ns, size)`` of each, as
everywhere else a dashboard asks whether a file moved (``rundir.file_stamp``).

The file is a cache, never the truth: a value is used only when its stamps match and it was
written by this version of steadytune; anything else (a missing, unreadable or foreign file, a
stamp that moved) is computed again from the run's own files. It is replaced atomically, so a
reader sees the old file or the new one.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from steadytune import __version__
from steadytune.regularfile import read_text
from steadytune.rundir import RunDir, atomic_write_text, file_stamp

NAME = "dashboard-summary.json"
FORMAT = 1

Stamp = tuple[tuple[int, int] | None, ...]


def source_stamp(run: RunDir) -> Stamp:
    """The stamps of the files a finished run's pages and scrape are derived from.

    Not ``run.db``: it is derived from these files too, and opening it (SQLite's write-ahead
    log, an index adopted or summarized) moves its stamp without changing what it says.
    """
    paths = (run.status, run.events, run.plan, run.config, run.system, *run.telemetry_files(),
             run.checkpoints, run.latest_pointer, run.last_good_pointer)  # fmt: skip
    return tuple(file_stamp(p) for p in paths)


def _plain(stamp: Stamp) -> list[list[int] | None]:
    """``stamp`` as JSON reads it back, so a stored stamp compares equal to a fresh one."""
    return [list(s) if s is not None else None for s in stamp]


class StoredSummary:
    """One run's stored values, by name; read from disk once, written through on :meth:`put`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._values: dict[str, Any] | None = None
        self._read_at: tuple[int, int] | None = None  # the file's stamp when it was read or written here
        self._lock = threading.Lock()  # the scrape and a page may store values of one run together

    def get(self, name: str, stamp: Stamp) -> tuple[bool, Any]:
        """``(True, value)`` when ``name`` was stored for exactly ``stamp``; else ``(False, None)``."""
        with self._lock:
            hit = self._read().get(name)
        if isinstance(hit, dict) and hit.get("stamp") == _plain(stamp) and "value" in hit:
            return True, hit["value"]
        return False, None

    def has(self, name: str) -> bool:
        """Whether a value is stored under ``name`` at all (one ``stat`` once the file was read)."""
        with self._lock:
            return name in self._read()

    def put(self, name: str, stamp: Stamp, value: Any) -> None:
        """Keep ``value`` for ``stamp``; a folder that cannot be written to loses only the cache."""
        with self._lock:
            values = dict(self._read())
            values[name] = {"stamp": _plain(stamp), "value": value}
            self._values = values
            text = json.dumps({"format": FORMAT, "steadytune": __version__, "values": values})
            try:
                atomic_write_text(self.path, text, durable=False)
            except OSError:
                return
            self._read_at = file_stamp(self.path)

    def _read(self) -> dict[str, Any]:
        """The values, read again when the file moved since: the dashboard's background reader
        (``web/warm.py``) writes them from its own process."""
        stamp = file_stamp(self.path)
        if self._values is None or stamp != self._read_at:
            self._values, self._read_at = _load(self.path), stamp
        return self._values


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(read_text(path))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("steadytune") != __version__:
        return {}  # another version may derive other values from the same files
    values = data.get("values")
    return values if isinstance(values, dict) else {}


def summary_path(run: RunDir, cache_dir: Path, writable: bool) -> Path:
    """Where ``run``'s stored values live: its own folder, or the dashboard's cache if not ours."""
    return run.root / NAME if writable else cache_dir / f"{run.run_id}.{NAME}"


__all__ = ["NAME", "StoredSummary", "source_stamp", "summary_path"]

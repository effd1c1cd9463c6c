"""The runs a dashboard shows: discovered under a runs directory, each with its index.

A run is a folder of ``runs_dir`` that has a ``status.json``, a ``telemetry/``
folder or an ``events.jsonl``. Its index is the run's ``run.db`` when the
supervisor keeps one; otherwise the dashboard builds and tails one itself from
the JSONL (``RunStore.sync``), in the background, so a request never waits for
indexing. Only the files of the run directory are read (see DESIGN.md).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from steadytune.checkpoint.external import check_external_checkpoint
from steadytune.checkpoint.manifest import MANIFEST, checkpoint_step, list_checkpoints, verify
from steadytune.checkpoint.store import pointer_name
from steadytune.config.detect import DetectConfig
from steadytune.config.yamlsafe import read_yaml
from steadytune.goodput.load import AccountCache
from steadytune.regularfile import read_text
from steadytune.rundir import RunDir, file_stamp, looks_like_run, valid_run_id
from steadytune.scratch import owned_tempdir, remove
from steadytune.telemetry.jsonl import within_depth
from steadytune.telemetry.liveness import status_live
from steadytune.telemetry.store import RunStore
from steadytune.telemetry.store.schema import UnreadableIndex
from steadytune.web.stored import StoredSummary, source_stamp, summary_path

log = logging.getLogger(__name__)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(read_text(path))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested too deep to parse
        return None
    # Nested too deep for the handlers that walk it (clean(), json.dumps): as good as unreadable.
    return data if isinstance(data, dict) and within_depth(data) else None


def checkpoint_info(ckpt_dir: Path) -> dict[str, Any]:
    """What the dashboard says about one checkpoint; ``verified`` = whole enough to resume from.

    With a manifest, the checkpoint module's size check (``verify(deep=False)``): the sha256 of
    every file is what resume checks, and too slow for a page refreshed every few seconds. A
    checkpoint another tool wrote (a supervised command's ``checkpoint-N``) has no manifest: it
    gets the check its supervisor resumes by (:func:`check_external_checkpoint`), and its time
    is that of its ``trainer_state.json``, which the trainer writes after the weights.
    """
    if not (ckpt_dir / MANIFEST).exists():
        return _external_info(ckpt_dir)
    verdict = verify(ckpt_dir, deep=False)
    data = verdict.manifest.data if verdict.manifest is not None else {}
    ts = data.get("ts") or data.get("created_ts") or data.get("created")
    if ts is None and verdict.manifest is not None:
        try:
            ts = (ckpt_dir / MANIFEST).stat().st_mtime
        except OSError:
            pass
    info: dict[str, Any] = {
        "name": ckpt_dir.name,
        "verified": verdict.ok and bool(data.get("verified", True)),
        "step": verdict.step,
        "ts": ts,
        "size_bytes": verdict.total_bytes if verdict.ok else None,
    }
    if not verdict.ok:
        info["problem"] = verdict.reason
    return info


def _external_info(ckpt_dir: Path) -> dict[str, Any]:
    ok, reason = check_external_checkpoint(ckpt_dir)
    try:
        ts: float | None = (ckpt_dir / "trainer_state.json").stat().st_mtime
    except OSError:
        ts = None
    size = None
    if ok:
        size = sum(p.stat().st_size for p in ckpt_dir.rglob("*") if p.is_file())
    info: dict[str, Any] = {
        "name": ckpt_dir.name,
        "verified": ok,
        "step": checkpoint_step(ckpt_dir),
        "ts": ts,
        "size_bytes": size,
    }
    if not ok:
        info["problem"] = reason
    return info


def _ckpt_stamp(d: Path) -> tuple[int, ...]:
    """What changes when a checkpoint's verdict may: its manifest, or (without one) its folder and
    ``trainer_state.json`` (a save of another tool adds files, then that file)."""
    return tuple(
        st.st_mtime_ns if (st := _stat(p)) else -1 for p in (d / MANIFEST, d, d / "trainer_state.json")
    )


def _stat(p: Path) -> os.stat_result | None:
    try:
        return p.stat()
    except OSError:
        return None


Stamp = tuple[tuple[int, int] | None, ...]
QUIET_MAX_S = 2.0  # the longest a run whose files stand still waits for the indexer to look again


class _Pending:
    """What :meth:`RunEntry.memo` answers for a run not read yet, when a request may not wait for it."""

    def __repr__(self) -> str:
        return "PENDING"


PENDING: Any = _Pending()


class RunEntry:
    """One run: its paths, its status and its index (kept fresh by :meth:`refresh`).

    What the pages and ``/metrics`` derive from a run whose supervisor is gone is kept
    (:meth:`memo`) until one of its files changes: a runs folder of a thousand finished runs
    is read once, not on every scrape and every second of the runs page.
    """

    def __init__(
        self,
        run_dir: RunDir,
        cache_dir: Path,
        clock: Callable[[], float] = time.time,
        kept: StoredSummary | None = None,
        want: Callable[[RunEntry], None] | None = None,
    ) -> None:
        self.dir = run_dir
        d = run_dir
        # What status() and stamp() look at, made once: a runs page asks for a thousand runs' stamps
        # a second, and building their paths again each time was two thirds of it.
        self._status_path = d.status
        self._stamped = (self._status_path, d.db, d.db.with_name(d.db.name + "-wal"), d.events,
                         d.checkpoints, d.latest_pointer, d.last_good_pointer)  # fmt: skip
        self.kept = kept  # where what memo() derives of the finished run is kept between dashboards
        # Given: a run never read is left to the background reader (RunsIndex.want), not read by a request.
        self.want = want
        self.clock = clock
        self._cache_dir = cache_dir
        self._store: RunStore | None = None
        self._owned = False  # True when this dashboard keeps the index up to date
        self._sizes: tuple[int, ...] = ()
        self._lock = threading.Lock()
        self._ckpt_cache: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}
        self._detect_cache: tuple[tuple[int, int], DetectConfig] | None = None
        self._status: tuple[tuple[int, int] | None, dict[str, Any]] | None = None
        self._memo: dict[str, tuple[Stamp | None, Any]] = {}  # None: shown while live
        self.checked: tuple[int, int] | None = None  # (device, inode) of the folder RunsIndex.get checked
        self._seen: tuple[int, ...] | None = None  # the files' sizes at the last refresh
        self.quiet = False  # they had not moved since the refresh before
        self.next_refresh = 0.0  # RunsIndex.refresh_due: when to look again (monotonic seconds)
        self.refresh_wait = 0.0

    @property
    def run_id(self) -> str:
        return self.dir.run_id

    def status(self) -> dict[str, Any]:
        """The run's ``status.json``, read again only when the file changed (a copy: callers may add)."""
        path = self._status_path
        stamp = file_stamp(path)
        cached = self._status
        if cached is None or cached[0] != stamp or stamp is None:
            cached = self._status = (stamp, read_json(path) or {})
        return dict(cached[1])

    def supervisor_live(self, status: dict[str, Any] | None = None) -> bool:
        return status_live(self.status() if status is None else status, self.clock())

    def stamp(self) -> Stamp:
        """What changes when anything a page shows of the run changes: its status, its index (and
        the index's write-ahead log), its events, checkpoints and pointers."""
        return tuple(file_stamp(p) for p in self._stamped)

    def memo(
        self,
        name: str,
        compute: Callable[[], Any],
        load: Callable[[Any], Any] | None = None,
        wait: bool | None = None,
    ) -> Any:
        """``compute()``, kept for a run without a live supervisor until :meth:`stamp` changes.

        A live run's figures move every second: they are computed on every call. With ``load``
        (JSON back to the value), the value is also kept on disk (:mod:`.stored`) once the index
        holds every line of the run's files, and the next dashboard reads it back from there.

        ``wait=False`` (a request, when the entry has a background reader: the default then)
        never reads a finished run this dashboard has not read yet and whose value is not stored
        on disk: it hands the run to the background reader and answers :data:`PENDING`. A run
        read before (live then, or read by the background reader) is kept up to date here: its
        index is open and its goodput account read, so what changed costs little.
        """
        if self.supervisor_live():
            value = compute()
            self._memo[name] = (None, value)  # what was shown, should the run end before it is read again
            return value
        hit = self._memo.get(name)
        waits = self.want is None if wait is None else wait
        kept = self.kept if load is not None else None
        stored = kept is not None and kept.has(name)
        if hit is None and not stored and not waits:
            # Two stats, not the twenty of the stamps below: a thousand pending rows every second.
            return self._pending()
        stamp = self.stamp()
        if hit is not None and hit[0] == stamp:
            return hit[1]
        sizes = self._file_sizes() if stored and not self._sizes else None  # before the stamps: see below
        source = source_stamp(self.dir) if kept is not None else ()
        found, value = kept.get(name, source) if kept is not None and stored else (False, None)
        if found and load is not None:
            value = load(value)
            if sizes is not None:
                # Stored for these very files, from an index that held every line of them (the
                # background reader's, or an earlier dashboard's): the indexer need not open it
                # until they move (a thousand indexes opened, 3 files each, after a cold start).
                self._sizes = sizes
        elif hit is None and not waits:
            return self._pending()  # stored for files that changed since: read again, in the background
        else:
            value = compute()
            if kept is not None and self.indexed():
                kept.put(name, source, value)
        self._memo[name] = (stamp, value)
        return value

    def _pending(self) -> Any:
        if self.want is not None:
            self.want(self)
        return PENDING

    def seen(self) -> bool:
        """Whether this dashboard read the run (its index opened, or a value of it derived or loaded)."""
        return self._store is not None or bool(self._memo)

    def indexed(self) -> bool:
        """Whether the index holds every line of the run's files (a value derived from it is whole).

        The supervisor's index is whole once adopted (:meth:`store` opens it so); the one this
        dashboard builds, once :meth:`refresh` took in the files as they are now.
        """
        store = self.store()
        return not self._owned or store.readonly or self._sizes == self._file_sizes()

    def store(self) -> RunStore:
        """The run's index, opened on first use (building it if there is none)."""
        with self._lock:
            if self._store is None:
                self._store = self._open()
            return self._store

    def _open(self) -> RunStore:
        db = self.dir.db
        if db.exists():
            try:
                store = RunStore(db) if os.access(db.parent, os.W_OK) else RunStore(db, readonly=True)
            except UnreadableIndex:
                return self._instead_of_unreadable(db)
            self._owned = store.get_meta("indexer") == "dashboard"
            if not self._owned and not store.readonly:
                # Filled by the supervisor's add_*: continue from the end of what it indexed.
                store.adopt(self.dir)
            return store
        if os.access(self.dir.root, os.W_OK):
            store = RunStore(db)
        else:
            # Someone else's runs, read-only: index into our own cache instead.
            store = RunStore(self._cache_dir / f"{self.run_id}.db")
        store.set_meta("indexer", "dashboard")
        self._owned = True
        return store

    def _instead_of_unreadable(self, db: Path) -> RunStore:
        """A fresh index for a run whose ``run.db`` SQLite cannot read (cut short, overwritten).

        The index is derived from the run's files, which stay the truth. It was shown as an
        "unreadable" run with no page until someone moved the file aside by hand. A finished
        run's is moved aside now (``run.db.unreadable``, kept for whoever wants to look) and
        rebuilt in its place; a live supervisor's, or one in a folder this dashboard may not
        write, is left as it is, and the dashboard indexes the run in its own cache.
        """
        if os.access(db.parent, os.W_OK) and not self.supervisor_live():
            for suffix in ("", "-wal", "-shm"):
                part = db.with_name(db.name + suffix)
                if part.exists():
                    os.replace(part, db.with_name(f"{db.name}.unreadable{suffix}"))
            log.warning(
                "%s is not a readable index: kept as %s.unreadable, rebuilt from the run's streams",
                db,
                db.name,
            )
            store = RunStore(db)
        else:
            log.warning("%s is not a readable index: the run is indexed in %s", db, self._cache_dir)
            store = RunStore(self._cache_dir / f"{self.run_id}.db")
        store.set_meta("indexer", "dashboard")
        self._owned = True
        return store

    def _file_sizes(self) -> tuple[int, ...]:
        sizes = []
        for p in (*self.dir.telemetry_files(), self.dir.system, self.dir.events, self.dir.plan):
            try:
                sizes.append(p.stat().st_size)
            except OSError:
                sizes.append(-1)
        return tuple(sizes)

    def refresh(self) -> int:
        """Index new JSONL lines unless a live supervisor keeps the index; returns records added."""
        sizes = self._file_sizes()
        self.quiet, self._seen = sizes == self._seen, sizes
        if sizes == self._sizes:
            return 0  # nothing appended: not even the index is opened (a thousand runs, five times a second)
        store = self.store()
        if store.readonly or (not self._owned and self.supervisor_live()):
            return 0
        added = store.sync(self.dir)
        self._sizes = sizes
        return added

    def checkpoints(self) -> dict[str, Any]:
        """The run's checkpoints, oldest step first, with the names its pointers give.

        Where its supervisor said they are (``status.json``'s ``checkpoint_dir``: a supervised
        command's own output folder, its ``checkpoint-N`` folders), else the run's ``checkpoints/``.
        """
        where = self.status().get("checkpoint_dir")
        latest = pointer_name(self.dir.latest_pointer)
        last_good = pointer_name(self.dir.last_good_pointer)
        items = []
        if isinstance(where, str) and where and Path(where) != self.dir.checkpoints:
            dirs = list_checkpoints(Path(where))
        else:
            try:
                dirs = [
                    p for p in self.dir.checkpoints.iterdir() if p.is_dir() and not p.name.startswith(".")
                ]
            except OSError:
                dirs = []
        for d in dirs:
            stamp = _ckpt_stamp(d)
            key = str(d)
            cached = self._ckpt_cache.get(key)
            if cached is None or cached[0] != stamp:
                cached = (stamp, checkpoint_info(d))
                self._ckpt_cache[key] = cached
            info = dict(cached[1])
            info["latest"] = d.name == latest
            info["last_good"] = d.name == last_good
            items.append(info)
        items.sort(key=lambda c: (c["step"] is None, c["step"] or 0, c["name"]))
        return {"latest": latest, "last_good": last_good, "items": items}

    def detect_config(self) -> DetectConfig:
        """The run's own ``detect:`` thresholds, from the config.yaml its supervisor wrote.

        The defaults when the run has none (a watched log, an imported run) or it does not
        load: the page then marks what a default run's detectors would report.
        """
        path = self.dir.config
        try:
            st = path.stat()
        except OSError:
            return DetectConfig()
        # Size as well as time: a coarse clock may give a rewrite the same mtime.
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._detect_cache
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            data = read_yaml(path)
            section = data.get("detect") if isinstance(data, dict) else None
            cfg = DetectConfig.model_validate(section if isinstance(section, dict) else {})
        except (OSError, yaml.YAMLError, ValidationError):
            cfg = DetectConfig()
        self._detect_cache = (stamp, cfg)
        return cfg

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


# The training figures of a step's row: its time, memory and the index's totals (tokens, non-finite
# steps) stay as they were.
_STEP_ONLY = ("loss", "eval_loss", "grad_norm", "lr", "step_time_s", "nonfinite_latest")


def current_values(latest: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """The index's latest values that are the run's now.

    After a rollback or a restart from a checkpoint, the index's highest step is the abandoned
    attempt's until the resumed one passes it (its loss stood at 69.26 for a minute after the
    rollback it caused): then its step's own values are left out, and the supervisor's status
    (the resumed timeline's step, and its loss once it has logged one) speaks for them.
    """
    attempt = status.get("attempt")
    if not latest or not isinstance(attempt, int) or int(latest.get("attempt") or 0) >= attempt:
        return latest
    return {k: v for k, v in latest.items() if k not in _STEP_ONLY}


def newness(entry: RunEntry) -> float:
    """When the run last moved, as its status says (else its status file's time): newest read first."""
    ts = entry.status().get("updated_ts")
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        return float(ts)
    stamp = file_stamp(entry.dir.status)
    return stamp[0] / 1e9 if stamp is not None else 0.0


class RunsIndex:
    """Every run under ``runs_dir``; run ids are validated before any path is built.

    With ``background=True`` (a dashboard server) a request never reads a finished run this
    dashboard has not read yet: the run is *wanted* (:meth:`want`) and read by the background
    reader (``web/warm.py``), newest first; until then the pages show what its ``status.json``
    says and ``/metrics`` leaves its series out.
    """

    def __init__(
        self,
        runs_dir: Path,
        clock: Callable[[], float] = time.time,
        cache_dir: Path | None = None,
        background: bool = False,
    ) -> None:
        self.runs_dir = Path(runs_dir)
        self.clock = clock
        self.background = background
        # Runs a request could not answer for, not read yet, with their newness when first wanted.
        self._wanted: dict[str, tuple[float, RunEntry]] = {}
        self._wanted_lock = threading.Lock()
        self.wanted_event = threading.Event()  # set when a run is wanted: the reader wakes
        self._own_cache = cache_dir is None
        self._cache_dir = cache_dir or owned_tempdir("steadytune-dash-")
        self._entries: dict[str, RunEntry] = {}
        self._lock = threading.Lock()
        self._listing: tuple[tuple[int, int], set[str], set[str]] | None = None  # stamp, runs, not yet
        self._list_lock = threading.Lock()
        self._kept: dict[str, StoredSummary] = {}
        self._kept_lock = threading.Lock()
        # Goodput, read incrementally for the panel and /metrics; a finished run's kept on disk.
        self.accounts = AccountCache(clock, lambda run: self.kept(run))

    def run_ids(self) -> list[str]:
        """The runs under ``runs_dir``, in name order.

        The folder is listed again only when its own mtime moved (a run added or removed); a
        folder that did not look like a run yet (its supervisor just made it) is looked at again
        each time, and one that did is kept until the listing changes.
        """
        stamp = file_stamp(self.runs_dir)
        if stamp is None:
            return []
        with self._list_lock:
            if self._listing is None or self._listing[0] != stamp:
                try:
                    names = [p.name for p in self.runs_dir.iterdir() if valid_run_id(p.name)]
                except OSError:
                    return []
                self._listing = (stamp, set(), set(names))
            _, runs, pending = self._listing
            for name in [n for n in pending if looks_like_run(self.runs_dir / n)]:
                runs.add(name)
                pending.discard(name)
            return sorted(runs)

    def get(self, run_id: str, listed: bool = False) -> RunEntry | None:
        """The run, or ``None`` for an invalid id, a path outside ``runs_dir`` or no such run.

        ``listed``: ``run_id`` comes from :meth:`run_ids`, which saw that it looks like a run.
        """
        if not valid_run_id(run_id):
            return None
        root = self.runs_dir / run_id
        try:
            st = os.lstat(root)
        except OSError:
            return None
        here = (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None
        with self._lock:
            entry = self._entries.get(run_id)
        if entry is not None and here is not None and entry.checked == here:
            return entry  # the very directory checked below when the entry was made (a link never is)
        try:
            # A directory itself (lstat: no link) named by a valid id is inside runs_dir: only a link
            # is resolved (2,000 resolves were most of a new dashboard's first scrape of 1,000 runs).
            if here is None and root.resolve().parent != self.runs_dir.resolve():
                return None
            if not listed and not looks_like_run(root):
                return None
        except OSError:
            return None
        with self._lock:
            entry = self._entries.get(run_id)
            if entry is None:
                want = self.want if self.background else None
                entry = RunEntry(RunDir(root), self._cache_dir, self.clock, self.kept(RunDir(root)), want)
                self._entries[run_id] = entry
            entry.checked = here
            return entry

    def kept(self, run: RunDir) -> StoredSummary:
        """The values kept on disk for ``run`` (one object per run: its writers take its lock)."""
        with self._kept_lock:
            kept = self._kept.get(run.run_id)
            if kept is None:
                path = summary_path(run, self._cache_dir, os.access(run.root, os.W_OK))
                kept = self._kept[run.run_id] = StoredSummary(path)
            return kept

    def entries(self) -> list[RunEntry]:
        return [e for e in (self.get(r, listed=True) for r in self.run_ids()) if e is not None]

    def want(self, entry: RunEntry) -> None:
        """Hand ``entry`` to the background reader: a request needed what only reading it gives."""
        with self._wanted_lock:
            if entry.run_id in self._wanted:
                return
        when = newness(entry)  # once: the reader picks among a thousand runs for each one it reads
        with self._wanted_lock:
            self._wanted.setdefault(entry.run_id, (when, entry))
        self.wanted_event.set()

    def pending(self) -> int:
        """Runs wanted and not read yet (the one being read counts until it is done)."""
        return len(self.unread())

    def unread(self) -> set[str]:
        """The ids of the runs wanted and not read yet."""
        with self._wanted_lock:
            return set(self._wanted)

    def newest_wanted(self) -> RunEntry | None:
        """The wanted run that moved last (a recent run is the one a user looks for first)."""
        with self._wanted_lock:
            newest = max(self._wanted.values(), key=lambda w: w[0], default=None)
        return newest[1] if newest is not None else None

    def read(self, entry: RunEntry) -> None:
        """``entry`` was read: what a request asks of it is now at hand."""
        with self._wanted_lock:
            self._wanted.pop(entry.run_id, None)

    def forget(self, entry: RunEntry) -> None:
        """Close ``entry``'s index and drop it: the background reader's process reads a thousand runs once."""
        with self._lock:
            if self._entries.get(entry.run_id) is entry:
                del self._entries[entry.run_id]
        entry.close()

    @property
    def cache_dir(self) -> Path:
        """Where the indexes and stored values of runs whose folder is not ours are kept."""
        return self._cache_dir

    def refresh_all(self) -> None:
        for entry in self.entries():
            try:
                entry.refresh()
            except Exception:  # one broken run must not stop the others' updates
                continue

    def refresh_due(self, now: Callable[[], float] = time.monotonic) -> None:
        """:meth:`refresh_all` for the background indexer, which calls it five times a second: a run
        whose files stood still is looked at less and less often, down to every
        :data:`QUIET_MAX_S`, and at every call again once they move.

        Looking costs a listing of its telemetry folder and a few ``stat`` calls: for a thousand
        finished runs, 130 ms a pass, two fifths of the dashboard's time when done five times a second.
        With ``background``, a finished run this dashboard has not read is not looked at: opening a
        thousand indexes at the start held the first requests; the background reader brings a
        run's index up to date as it reads it.
        """
        t = now()
        for entry in self.entries():
            if t < entry.next_refresh:
                continue
            if self.background and not entry.seen() and not entry.supervisor_live():
                continue  # a finished run nobody asked for yet: the background reader's when it is
            try:
                entry.refresh()
            except Exception:  # one broken run must not stop the others' updates
                continue
            entry.refresh_wait = min(QUIET_MAX_S, max(0.2, 2 * entry.refresh_wait)) if entry.quiet else 0.0
            entry.next_refresh = t + entry.refresh_wait

    def close(self) -> None:
        with self._lock:
            for e in self._entries.values():
                e.close()
            self._entries.clear()
        if self._own_cache:
            remove(self._cache_dir)

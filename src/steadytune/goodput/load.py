"""Reading a run directory into a :class:`~steadytune.goodput.account.RunHistory`, and its account.

The thin side of the goodput account: every file goes through the one JSONL reader
(``telemetry/stream.py``), incrementally, so a dashboard that asks again reads only what was
appended. Only the records the account reads are kept (``account.relevant``), step records
without their fields beyond timing, and a heartbeat only where the phase changes: a
100k-step run is held in a few MB.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import yaml

from steadytune.config.yamlsafe import read_yaml
from steadytune.goodput.account import account, interruption_record, relevant
from steadytune.goodput.parts import Account, RunHistory, StreamRecord
from steadytune.records import Event, Heartbeat, PlanRevision, from_dict
from steadytune.regularfile import read_text
from steadytune.rundir import RunDir, file_stamp
from steadytune.telemetry.liveness import status_live
from steadytune.telemetry.stream import JsonlTailer

_SLIM = ("type", "step", "ts", "rank", "attempt", "step_time_s", "skipped")


def _slim(d: dict[str, Any]) -> dict[str, Any]:
    """A step line with what the account reads (its place in time, attempt, timing and kind), before
    it becomes a record: its batch's indices and hashes and its gradient flow are never built."""
    out = {k: d[k] for k in _SLIM if k in d}
    extra = d.get("extra")
    out["extra"] = {"eval": True} if isinstance(extra, dict) and extra.get("eval") else {}
    return out


class HistoryReader:
    """A run's history, read incrementally: each :meth:`read` adds what was appended since the last."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self._plans = JsonlTailer(run.plan)
        self._events = JsonlTailer(run.events)
        self._stream = JsonlTailer(run.telemetry(0))
        self.plans: list[PlanRevision] = []
        self.events: list[Event] = []
        self.stream: list[StreamRecord] = []
        self._gpus: int | None = None
        self._lock = threading.Lock()  # one reading at a time: a scrape and a page may ask together

    def read(self) -> RunHistory:
        with self._lock:
            return self._read()

    def _read(self) -> RunHistory:
        for rec in self._plans.records():
            if isinstance(rec, PlanRevision):
                self.plans.append(rec)
        for rec in self._events.records():
            if isinstance(rec, Event) and relevant(rec):
                self.events.append(replace(rec, message="", data=_event_data(rec)))
        stream = self._stream
        for d in stream.dicts():
            try:
                rec = from_dict(_slim(d) if d.get("type") == "step" else d)
            except (ValueError, TypeError):
                stream.bad_lines += 1
                continue
            if not relevant(rec) or isinstance(rec, PlanRevision):
                continue
            if isinstance(rec, Heartbeat):
                last = self.stream[-1] if self.stream else None
                if isinstance(last, Heartbeat) and (last.attempt, last.phase) == (rec.attempt, rec.phase):
                    continue  # the same phase beating on: nothing the account reads changes
            self.stream.append(rec)  # type: ignore[arg-type]
        return RunHistory(
            tuple(self.plans), tuple(self.stream), tuple(self.events), self.run.run_id, self.gpus()
        )

    def gpus(self) -> int:
        """The training processes the run holds: its newest plan's, else its config's, else one."""
        for plan in reversed(self.plans):
            size = plan.world_size or plan.nproc_per_node
            if size:
                return int(size)
        if self._gpus is None:
            self._gpus = _config_processes(self.run.config)
        return self._gpus


def _event_data(ev: Event) -> dict[str, Any]:
    """The few keys of an event's data the account reads (a restart's, run_started's launch, what a run
    was resumed after)."""
    keep = ("launch", "classification", "attempt", "start_step", "after")
    return {k: ev.data[k] for k in keep if k in ev.data}


def _config_processes(path: Path) -> int:
    try:
        data = read_yaml(path)
        value = data["run"]["nproc_per_node"]
    except (OSError, yaml.YAMLError, TypeError, KeyError):
        return 1
    return value if isinstance(value, int) and value > 0 else 1


def read_history(run: RunDir) -> RunHistory:
    """Everything the account reads of ``run``, as its directory holds it now."""
    return HistoryReader(run).read()


def interruptions(run: RunDir) -> tuple[int, float]:
    """``(interruptions, exposure seconds)`` of ``run``, from its plan revisions and events alone."""
    plans = [r for r in JsonlTailer(run.plan).records() if isinstance(r, PlanRevision)]
    events = [r for r in JsonlTailer(run.events).records() if isinstance(r, Event) and relevant(r)]
    return interruption_record(plans, events)


def read_status(run: RunDir) -> dict[str, Any]:
    try:
        data = json.loads(read_text(run.status))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def reading_time(run: RunDir, history: RunHistory, clock: Callable[[], float] = time.time) -> float | None:
    """The ``now`` of an account of ``run``: the clock while its supervisor runs, else None.

    A run whose supervisor is gone without a recorded end (killed) ends at its last record,
    not at the reading: the time since it died is no part of it.
    """
    now = clock()
    return now if status_live(read_status(run), now) else None


def run_account(run: RunDir, clock: Callable[[], float] = time.time) -> Account:
    """The goodput account of the run in ``run``, live or finished."""
    history = read_history(run)
    return account(history, reading_time(run, history, clock))


def _stamp(run: RunDir) -> tuple[tuple[int, int] | None, ...]:
    """``(mtime in ns, size)`` of every file an account reads (None where one is missing)."""
    return tuple(file_stamp(p) for p in (run.status, run.plan, run.events, run.telemetry(0), run.config))


class Kept(Protocol):
    """Where a finished run's account is kept between dashboards (``web/stored.py``)."""

    def get(self, name: str, stamp: tuple[Any, ...]) -> tuple[bool, Any]: ...

    def put(self, name: str, stamp: tuple[Any, ...], value: Any) -> None: ...


class AccountCache:
    """The accounts of many runs, each read incrementally: what a dashboard asks for every few seconds.

    ``kept(run)``, when given, keeps a finished run's account on disk, with the stamps of the
    files it was read from: a dashboard that starts again reads it back instead of every line
    of the run's telemetry, until one of those files changes.
    """

    def __init__(
        self, clock: Callable[[], float] = time.time, kept: Callable[[RunDir], Kept] | None = None
    ) -> None:
        self.clock = clock
        self.kept = kept
        self._readers: dict[Path, HistoryReader] = {}  # live runs only
        self._done: dict[Path, tuple[tuple[Any, ...], Account]] = {}  # finished runs, by their files' stamps
        self._live: dict[Path, tuple[float, float, Account]] = {}  # live runs: when computed, its cost, it
        self._lock = threading.Lock()

    def account(self, run: RunDir) -> Account:
        """``run``'s account now: only what was appended since the last call is read.

        A finished run's account is computed again only when one of its files changed, and its
        records are not kept (a runs folder of a thousand finished runs would hold every step of
        each); a live run's at most once per five times what computing it costs (a second at
        least), so that a dashboard polling a 100k-step run spends a fifth of a core on it at most.
        """
        now = self.clock()
        live = self._live.get(run.root)
        if live is not None and now - live[0] < max(1.0, 5 * live[1]):
            return live[2]
        stamp = _stamp(run)  # before the reading: a file that grows meanwhile is read again next time
        at_hand = self._at_hand(run, stamp, stored=live is None)
        if at_hand is not None:
            return at_hand
        with self._lock:
            reader = self._readers.get(run.root)
            if reader is None:
                reader = self._readers[run.root] = HistoryReader(run)
        history = reader.read()
        when = reading_time(run, history, self.clock)
        started = time.perf_counter()
        acct = account(history, when)
        if when is None:
            self._done[run.root] = (stamp, acct)
            if self.kept is not None:
                self.kept(run).put("goodput", stamp, acct.stored())
            self._live.pop(run.root, None)
            with self._lock:
                self._readers.pop(run.root, None)
        else:
            self._live[run.root] = (now, time.perf_counter() - started, acct)
        return acct

    def known(self, run: RunDir) -> Account | None:
        """``run``'s account if it is at hand without reading the run's files (it was read or stored
        for the files as they are now); else None: the caller reads it with :meth:`account` later."""
        return self._at_hand(run, _stamp(run), stored=True)

    def _at_hand(self, run: RunDir, stamp: tuple[Any, ...], stored: bool) -> Account | None:
        done = self._done.get(run.root)
        if done is not None and done[0] == stamp:
            return done[1]
        kept = self._stored(run, stamp) if stored else None
        if kept is not None:
            self._done[run.root] = (stamp, kept)
        return kept

    def _stored(self, run: RunDir, stamp: tuple[Any, ...]) -> Account | None:
        """The account kept for exactly these files when the run had ended, if there is one."""
        if self.kept is None:
            return None
        found, value = self.kept(run).get("goodput", stamp)
        if not found:
            return None
        try:
            return Account.from_dict(value)
        except (KeyError, TypeError, ValueError):
            return None  # not what this version writes: read the run again

"""Observers of a live run: the SQLite index and the alert router, behind one guard.

Each receives every record and every filed event, and is flushed once a second, or at the
supervisor's next turn after an event was filed; none of them may block the supervisor for long.
Flushed at every turn (about five a second), the run index's commits were a third of the
supervisor's own CPU at 10 steps/s; an event still reaches the index (and the dashboard) at once.
They are called through :class:`Observers` alone: one that raises is disabled, with an
``observer_disabled`` event that says which and why, and the run goes on without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from steadytune.records import Event, Heartbeat, Record, WorkerExit
from steadytune.rundir import RunDir


class Observer(Protocol):
    """Something that follows a live run (store, detectors, dashboard feed, alerts)."""

    def on_record(self, record: Record) -> None: ...
    def on_event(self, event: Event) -> None: ...
    def flush(self) -> None:
        """Write out what was batched since the last flush."""

    def close(self) -> None: ...


# Told which observer failed, in which call, and what it raised.
Report = Callable[[Observer, str, BaseException], None]


class Observers:
    """The run's observers, each call guarded: a failing one is disabled and reported, never fatal."""

    def __init__(
        self, observers: Iterable[Observer] = (), report: Report | None = None, every_s: float = 1.0
    ) -> None:
        self.live: list[Observer] = list(observers)
        self.disabled: list[tuple[Observer, str]] = []  # and why
        self.report = report
        self.every_s = every_s
        self._flushed_at: float | None = None
        self._event_waiting = False

    def append(self, observer: Observer) -> None:
        self.live.append(observer)

    def record(self, record: Record) -> None:
        self._each("on_record", record)

    def event(self, event: Event) -> None:
        self._event_waiting = True
        self._each("on_event", event)

    def flush(self) -> None:
        self._event_waiting = False
        self._each("flush")

    def tick(self, now: float) -> None:
        """Flush when an event waits or ``every_s`` has passed since the last flush."""
        if self._event_waiting or self._flushed_at is None or now - self._flushed_at >= self.every_s:
            self._flushed_at = now
            self.flush()

    def close(self) -> None:
        self._each("close")

    def _each(self, call: str, *args: Any) -> None:
        for obs in list(self.live):
            if obs not in self.live:
                continue  # disabled meanwhile (a report of another's failure reached it, and it failed too)
            try:
                getattr(obs, call)(*args)
            except Exception as exc:  # an observer's trouble must never end the run
                self._disable(obs, call, exc)

    def _disable(self, obs: Observer, call: str, exc: BaseException) -> None:
        # Off the list before the report: the report is an event, which reaches the observers again.
        self.live.remove(obs)
        self.disabled.append((obs, f"{call}: {type(exc).__name__}: {exc}"))
        if self.report is not None:
            self.report(obs, call, exc)


class StoreObserver:
    """Keeps ``run.db`` in step with the JSONL, batching writes per supervisor tick."""

    def __init__(self, run: RunDir) -> None:
        from steadytune.telemetry.store import RunStore

        self.store = RunStore(run.db)
        self._batch: list[Any] = []
        self._last_event: Event | None = None

    def on_record(self, record: Record) -> None:
        if not isinstance(record, (Heartbeat, WorkerExit, Event)):
            self._batch.append(record)

    def on_event(self, event: Event) -> None:
        self._batch.append(event)
        self._last_event = event

    def flush(self) -> None:
        if self._batch:
            batch, self._batch = self._batch, []
            self.store.add(batch)
        if self._last_event is not None and self._last_event.hash:
            # `audit verify` compares the log's tail against this, to catch truncation.
            self.store.set_meta("last_event_hash", self._last_event.hash)
            self.store.set_meta("last_event_seq", str(self._last_event.seq))
            self._last_event = None

    def close(self) -> None:
        self.flush()
        self.store.close()


class AlertObserver:
    """Hands every filed event to the alert router (which filters, dedups and delivers)."""

    def __init__(self, router: Any) -> None:
        self.router = router

    def on_record(self, record: Record) -> None:
        pass

    def on_event(self, event: Event) -> None:
        if event.kind != "alert":  # alerts are the router's own records: never re-route them
            self.router.submit(event)

    def flush(self) -> None:
        pass  # the router delivers from its own thread

    def close(self) -> None:
        self.router.close(timeout=10.0)

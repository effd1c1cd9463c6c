"""Observers of a live run: the SQLite index and the alert router.

Each receives every record and every filed event; none of them may block the
supervisor for long, and a failing one is disabled, never fatal.
"""

from __future__ import annotations

from typing import Any

from steadytune.records import Event, Heartbeat, Record, WorkerExit
from steadytune.rundir import RunDir


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

    def close(self) -> None:
        self.router.close(timeout=10.0)

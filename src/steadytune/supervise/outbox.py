"""What a run says, in one place: events filed, lines on the console, records for the observers.

Every part of the supervisor that has something to tell files it here: an event goes into
``events.jsonl`` (hash-chained, redacted before it is chained) and from there to every
observer (the run index, the alert router); one that is not just information is also
printed on the console, as filed. Records the supervisor reads (steps, samples, plan
revisions) reach the observers through :meth:`Outbox.record`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from steadytune.records import Event, Record
from steadytune.rundir import RunDir
from steadytune.supervise.observers import Observer, Observers
from steadytune.telemetry.events import EventLog


def said_on_console(kind: str, severity: str) -> bool:
    """Whether :meth:`Outbox.emit` prints an event of this kind and severity on the console."""
    return severity != "info" or kind in {"lifecycle", "action"}


class Outbox:
    """The run's event log, its console and its observers."""

    def __init__(self, run: RunDir, clock: Callable[[], float], console: Any = None) -> None:
        self.console = console
        self.observers = Observers(report=self._observer_failed)
        self.events = EventLog(run.events, run.run_id, clock=clock, on_append=self.observers.event)

    def say(self, text: str, style: str | None = None) -> None:
        if self.console is not None:
            self.console.print(text, style=style, highlight=False, markup=False, soft_wrap=True)

    def emit(self, kind: str, name: str, message: str = "", severity: str = "info", **fields: Any) -> Event:
        """File an event; a warning, a critical, a lifecycle step or an action is also said."""
        event = self.events.emit(kind, name, message, severity=severity, **fields)
        if said_on_console(kind, severity):
            style = {"critical": "bold red", "warning": "yellow"}.get(severity)
            self.say(f"[{kind}] {event.message or name}", style=style)  # as filed: redacted
        return event

    def record(self, record: Record) -> None:
        self.observers.record(record)

    def _observer_failed(self, obs: Observer, call: str, exc: BaseException) -> None:
        name = type(obs).__name__
        self.emit(
            "lifecycle",
            "observer_disabled",
            f"{name} disabled: its {call} raised {type(exc).__name__}: {exc}; the run goes on without it",
            severity="warning",
            data={"observer": name, "call": call, "error": f"{type(exc).__name__}: {exc}"},
        )

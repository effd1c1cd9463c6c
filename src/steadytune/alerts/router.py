"""The alert router: events in, alerts out to the sinks, without ever blocking training.

``submit(event)`` only puts the event on a queue. A background thread decides
whether it becomes an alert (severity, de-duplication, lifecycle options),
sends it to each sink whose minimum severity it meets, retries failures with
exponential backoff, and records the outcome in ``events.jsonl`` as an
``alert`` event: ``data.delivered`` lists the sinks that got it,
``data.undelivered`` maps the ones that never did to the (redacted) reason.

Everything that depends on time takes it from the injected ``clock``; tests
drive the router with ``start=False`` and :meth:`pump`.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steadytune.alerts.message import Alert, alert_from_event, test_alert
from steadytune.alerts.noise import Deduper, RateLimiter, backoff_delay
from steadytune.alerts.sinks import ConsoleSaid, DeliveryError, Sink, build_sinks
from steadytune.config.alerts import AlertsConfig
from steadytune.records import SEVERITY_ORDER, Event, grew_out_of
from steadytune.redact import Redactor
from steadytune.telemetry.events import EventLog

_FINISH = {"finish", "finished", "completed", "complete", "failed", "stopped", "end", "ended"}
_START = {"start", "started", "starting"}
_RESTART = {"restart", "restarted", "restarting"}


def lifecycle_phase(event: Event) -> str | None:
    """``start`` / ``finish`` / ``restart`` when the event is a step of the run's life, else ``None``.

    The supervisor files ``run_started`` / ``run_completed`` / ``run_failed`` / ``run_stopped``
    (kind ``lifecycle``) and starts each next attempt with an ``action`` named ``restart`` whose
    ``data.classification`` says why. The policy's own ``restart`` action (a hang) comes before
    that one and is not a phase: one restart, one alert. Other steps (``run_paused``,
    ``worker_started``) are not phases either.
    """
    n = event.name.lower()
    if event.kind == "action":
        return "restart" if n in _RESTART and "classification" in (event.data or {}) else None
    if event.kind != "lifecycle":
        return None
    n = n.removeprefix("run_")
    if n in _START:
        return "start"
    if n in _FINISH:
        return "finish"
    if n in _RESTART:
        return "restart"
    return None


@dataclass
class _Outcome:
    alert: Alert
    waiting: int
    delivered: list[str] = field(default_factory=list)
    undelivered: dict[str, str] = field(default_factory=dict)
    held_back: list[str] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)


@dataclass(order=True)
class _Delivery:
    due: float
    order: int
    sink_index: int = field(compare=False)
    alert: Alert = field(compare=False)
    attempt: int = field(compare=False, default=1)


class AlertRouter:
    """Routes events to sinks in a background thread. See the module docstring."""

    def __init__(
        self,
        config: AlertsConfig,
        event_log: EventLog | None,
        clock: Callable[[], float] = time.time,
        run_id: str | None = None,
        sinks: list[Sink] | None = None,
        redactor: Redactor | None = None,
        base_dir: Path | None = None,
        start: bool = True,
        environ: dict[str, str] | None = None,
        console_said: ConsoleSaid | None = None,
    ) -> None:
        self.config = config
        self.event_log = event_log
        self.clock = clock
        self.run_id = run_id or (event_log.run_id if event_log is not None else None) or "run"
        self.redactor = redactor or Redactor()
        if base_dir is None and event_log is not None:
            base_dir = event_log.path.parent
        self.sinks: list[Sink] = (
            sinks
            if sinks is not None
            else build_sinks(config, self.redactor, base_dir, environ, console_said)
        )
        self._limiters = [
            RateLimiter(s.rate_limit_per_hour or config.rate_limit_per_hour) for s in self.sinks
        ]
        self._dedup = Deduper(config.dedup_window_s)
        self._inbox: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._pending: list[_Delivery] = []
        self._outcomes: dict[str, _Outcome] = {}
        self._active: dict[tuple[str, str, str], list[int]] = {}  # dedup key -> sinks that got the raise
        self._order = itertools.count()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.recorded: list[Event] = []  # alert events written (kept for tests and `alert test`)
        if start and config.enabled:
            self._thread = threading.Thread(target=self._loop, name="steadytune-alerts", daemon=True)
            self._thread.start()

    # ---- the public face ------------------------------------------------------------

    def submit(self, event: Event) -> None:
        """Queue an event; returns at once and never raises."""
        if self._closing or not self.config.enabled:
            return
        try:
            self._inbox.put(event)
            self._wake.set()
        except Exception:  # pragma: no cover - a queue put does not fail; belt and braces
            pass

    def __call__(self, event: Event) -> None:
        """So the router can be an ``EventLog(on_append=router)`` hook."""
        self.submit(event)

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (one last try each, within ``timeout``), then stop."""
        self._closing = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self._final_drain(time.monotonic() + timeout)
        with self._lock:
            for d in self._pending:
                self._settle(d, f"not delivered: router closed after {d.attempt - 1} attempt(s)")
            self._pending.clear()

    def send_test(self) -> dict[str, str | None]:
        """Send a test alert through every sink now; sink name → error (``None`` = delivered)."""
        alert = test_alert(self.run_id, now=self.clock(), dashboard_url=self.config.dashboard_url)
        results: dict[str, str | None] = {}
        for sink in self.sinks:
            try:
                sink.send(alert)
                results[sink.name] = None
            except Exception as exc:  # a test reports every failure, whatever its type
                results[sink.name] = self.redactor.redact(str(exc))
        return results

    # ---- the engine -----------------------------------------------------------------

    def pump(self) -> int:
        """Route queued events and make every delivery that is due; returns deliveries tried."""
        with self._lock:
            while True:
                try:
                    event = self._inbox.get_nowait()
                except queue.Empty:
                    break
                try:
                    self._route(event)
                except Exception as exc:  # routing must never kill the thread
                    print(
                        f"steadytune alerts: cannot route event: {self.redactor(str(exc))}", file=sys.stderr
                    )
            tried = 0
            now = self.clock()
            while self._pending and (self._pending[0].due <= now or self._closing):
                d = heapq.heappop(self._pending)
                self._deliver(d, final=self._closing)
                tried += 1
            return tried

    def next_due(self) -> float | None:
        with self._lock:
            return self._pending[0].due if self._pending else None

    def _loop(self) -> None:
        while True:
            self.pump()
            if self._closing and self._inbox.empty() and not self._pending:
                return
            due = self.next_due()
            wait = 1.0 if due is None else max(0.01, min(1.0, due - self.clock()))
            self._wake.wait(wait)
            self._wake.clear()

    def _final_drain(self, deadline: float) -> None:
        # One pump whatever the time: each queued alert's last try is what close() promises, and a
        # process descheduled past the deadline before its first look must not skip it.
        while True:
            self.pump()
            if (self._inbox.empty() and not self._pending) or time.monotonic() >= deadline:
                return

    def _eligible(self, severity: str, ignore_min: bool = False) -> list[int]:
        rank = SEVERITY_ORDER.get(severity, 0)
        out = []
        for i, sink in enumerate(self.sinks):
            floor = sink.min_severity or (None if ignore_min else self.config.min_severity)
            if floor is None or rank >= SEVERITY_ORDER[floor]:
                out.append(i)
        return out

    def _route(self, event: Event) -> None:
        if event.kind in ("alert", "control"):
            return  # our own records, and operator requests, are not alerts
        now = self.clock()
        alert = alert_from_event(event, self.run_id, self.config.dashboard_url, now=now)
        key = alert.dedup_key
        phase = lifecycle_phase(event)
        if phase is not None and getattr(self.config.notify_on, phase):
            # Asked-for lifecycle alerts pass the router's floor, not a sink's own floor.
            targets = self._eligible(alert.severity, ignore_min=True)
        elif event.kind == "anomaly" or (event.kind == "action" and self.config.include_actions):
            targets = self._eligible(alert.severity)
            # An episode's severity rose: an update people must hear, whatever the dedup window says.
            escalated = event.kind == "anomaly" and bool((event.data or {}).get("escalated_from"))
            if not targets or (not escalated and not self._dedup.admit(key, now)):
                return
            if event.kind == "anomaly":
                told = set(self._active.get(key, []))
                # A graver kind grew out of these episodes: whoever heard of them hears of its end.
                for kind, metric in grew_out_of(event.data):
                    part = (alert.run_id, kind, metric)
                    told |= set(self._active.pop(part, []))
                    self._dedup.forget(part)
                self._active[key] = sorted(told | set(targets))
        elif event.kind == "resolved":
            targets = self._active.pop(key, [])
            self._dedup.forget(key)
            if not self.config.send_resolved or not targets:
                return  # nobody was told it was raised, so nobody needs to hear it cleared
        else:
            return
        if not targets:
            return
        self._outcomes[alert.id] = _Outcome(alert, waiting=len(targets))
        for i in targets:
            heapq.heappush(self._pending, _Delivery(now, next(self._order), i, alert))

    def _deliver(self, d: _Delivery, final: bool = False) -> None:
        sink, limiter = self.sinks[d.sink_index], self._limiters[d.sink_index]
        outcome = self._outcomes.get(d.alert.id)
        if outcome is None:
            return
        now = self.clock()
        alert = d.alert
        if d.attempt == 1:
            if not limiter.admit(now, alert.severity):
                outcome.held_back.append(sink.name)
                self._finish_one(outcome)
                return
            held = limiter.take_held_back()
            if held:
                alert = dataclasses.replace(alert, suppressed=held)
        outcome.attempts[sink.name] = d.attempt
        try:
            sink.send(alert)
        except Exception as exc:
            reason = self.redactor.redact(
                str(exc) if isinstance(exc, DeliveryError) else f"{type(exc).__name__}: {exc}"
            )
            permanent = isinstance(exc, DeliveryError) and exc.permanent
            if d.attempt >= self.config.retry.attempts or final or permanent:
                self._settle(d, reason)
                return
            delay = backoff_delay(d.attempt, self.config.retry.backoff_s, self.config.retry.max_backoff_s)
            heapq.heappush(
                self._pending, _Delivery(now + delay, next(self._order), d.sink_index, d.alert, d.attempt + 1)
            )
            return
        outcome.delivered.append(sink.name)
        self._finish_one(outcome)

    def _settle(self, d: _Delivery, reason: str) -> None:
        outcome = self._outcomes.get(d.alert.id)
        if outcome is None:
            return
        outcome.undelivered[self.sinks[d.sink_index].name] = reason
        self._finish_one(outcome)

    def _finish_one(self, outcome: _Outcome) -> None:
        outcome.waiting -= 1
        if outcome.waiting > 0:
            return
        self._outcomes.pop(outcome.alert.id, None)
        self._record(outcome)

    def _record(self, o: _Outcome) -> None:
        a = o.alert
        data: dict[str, Any] = {
            "alert_id": a.id, "source_kind": a.kind, "source_seq": a.source_seq, "metric": a.metric,
            "delivered": o.delivered, "undelivered": o.undelivered, "held_back": o.held_back,
            "attempts": o.attempts,
        }  # fmt: skip
        state = (
            "undelivered"
            if o.undelivered and not o.delivered
            else ("partial" if o.undelivered else "delivered")
        )
        if not o.delivered and not o.undelivered:
            state = "held back"
        data["status"] = state
        event = Event(
            ts=self.clock(), kind="alert", name=a.name, severity=a.severity,  # type: ignore[arg-type]
            step=a.step, message=self.redactor.redact(f"{a.title} [{state}]"),
            data=self.redactor.redact_obj(data),
        )  # fmt: skip
        if self.event_log is not None:
            try:
                event = self.event_log.append(event)
            except OSError as exc:
                print(f"steadytune alerts: cannot record alert: {exc}", file=sys.stderr)
        elif o.undelivered:
            print(f"steadytune alerts: {event.message}: {o.undelivered}", file=sys.stderr)
        self.recorded.append(event)

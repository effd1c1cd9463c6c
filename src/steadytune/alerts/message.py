"""What an alert says, and the payload formats the sinks send it in."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from steadytune.records import Event

_ICON = {"info": "ℹ️", "warning": "⚠️", "critical": "🚨"}
_DISCORD_COLOR = {"info": 0x3B82F6, "warning": 0xF59E0B, "critical": 0xEF4444}
_SLACK_COLOR = {"info": "#3b82f6", "warning": "#f59e0b", "critical": "#ef4444"}


@dataclass(frozen=True)
class Alert:
    """One message to people, built from an event (anomaly, resolved, lifecycle, action)."""

    id: str
    ts: float
    run_id: str
    kind: str  # event kind: anomaly | resolved | lifecycle | action | test
    name: str  # anomaly kind, lifecycle phase, action name
    severity: str
    title: str
    message: str
    step: int | None = None
    metric: str | None = None
    cause: str = ""
    suggestion: str = ""
    source_seq: int | None = None
    dashboard_url: str | None = None
    suppressed: int = 0  # how many alerts the rate limit held back before this one
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def dedup_key(self) -> tuple[str, str, str]:
        """Same run, kind and metric: the identity de-duplication works on."""
        return (self.run_id, self.name, self.metric or "")

    def text(self) -> str:
        """A plain-text rendering for console, e-mail and chat fallbacks."""
        lines = [f"{self.title}", self.message] if self.message else [self.title]
        # An anomaly's message already ends "Likely cause: ... Try: ...": said once, not twice.
        if self.cause and self.cause not in self.message:
            lines.append(f"cause: {self.cause}")
        if self.suggestion and self.suggestion not in self.message:
            lines.append(f"fix: {self.suggestion}")
        if self.suppressed:
            lines.append(f"({self.suppressed} more alert(s) held back by the rate limit)")
        if self.dashboard_url:
            lines.append(f"dashboard: {self.dashboard_url}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "ts": self.ts, "run_id": self.run_id, "kind": self.kind, "name": self.name,
            "severity": self.severity, "title": self.title, "message": self.message, "step": self.step,
            "metric": self.metric, "cause": self.cause, "suggestion": self.suggestion,
            "source_seq": self.source_seq, "dashboard_url": self.dashboard_url,
            "suppressed": self.suppressed, "evidence": self.evidence,
        }  # fmt: skip


def _title(event: Event, run_id: str) -> str:
    sev = event.severity.upper()
    where = f" at step {event.step}" if event.step is not None else ""
    if event.kind == "resolved":
        return f"RESOLVED {event.name} in {run_id}{where}"
    if event.kind == "lifecycle":
        return f"{run_id}: {event.name}{where}"
    if event.kind == "action":
        return f"{run_id}: action {event.name}{where}"
    return f"{sev} {event.name} in {run_id}{where}"


def alert_from_event(
    event: Event, run_id: str | None = None, dashboard_url: str | None = None, now: float | None = None
) -> Alert:
    """Build the alert for an event; anomaly details come from ``event.data``."""
    data = event.data or {}
    rid = run_id or event.run_id or "run"
    return Alert(
        id=uuid.uuid4().hex[:12],
        ts=event.ts or (now if now is not None else time.time()),
        run_id=rid,
        kind=event.kind,
        name=event.name,
        severity=event.severity,
        title=_title(event, rid),
        message=event.message,
        step=event.step,
        metric=data.get("metric"),
        cause=str(data.get("cause") or ""),
        suggestion=str(data.get("suggestion") or data.get("fix") or ""),
        source_seq=event.seq,
        dashboard_url=dashboard_url,
        evidence=dict(data.get("evidence") or {}),
    )


def test_alert(run_id: str = "test", now: float | None = None, dashboard_url: str | None = None) -> Alert:
    """The alert ``steadytune alert test`` sends through every sink."""
    return Alert(
        id=uuid.uuid4().hex[:12],
        ts=now if now is not None else time.time(),
        run_id=run_id,
        kind="test",
        name="test",
        severity="info",
        title=f"steadytune test alert ({run_id})",
        message="If you can read this, this sink works.",
        dashboard_url=dashboard_url,
    )


def generic_payload(alert: Alert) -> dict[str, Any]:
    return {"source": "steadytune", "alert": alert.to_dict(), "text": alert.text()}


def slack_payload(alert: Alert) -> dict[str, Any]:
    """Slack incoming-webhook format: a fallback ``text`` plus one coloured attachment."""
    fields = [{"title": "run", "value": alert.run_id, "short": True}]
    if alert.step is not None:
        fields.append({"title": "step", "value": str(alert.step), "short": True})
    if alert.cause:
        fields.append({"title": "cause", "value": alert.cause, "short": False})
    if alert.suggestion:
        fields.append({"title": "fix", "value": alert.suggestion, "short": False})
    attachment: dict[str, Any] = {
        "color": _SLACK_COLOR.get(alert.severity, "#888888"),
        "title": alert.title,
        "text": alert.message,
        "fields": fields,
        "footer": "steadytune",
        "ts": int(alert.ts),
    }
    if alert.dashboard_url:
        attachment["title_link"] = alert.dashboard_url
    icon = "✅" if alert.kind == "resolved" else _ICON.get(alert.severity, "")
    return {"text": f"{icon} {alert.title}".strip(), "attachments": [attachment]}


def discord_payload(alert: Alert) -> dict[str, Any]:
    """Discord webhook format: ``content`` plus one embed."""
    fields = [{"name": "run", "value": alert.run_id, "inline": True}]
    if alert.step is not None:
        fields.append({"name": "step", "value": str(alert.step), "inline": True})
    if alert.cause:
        fields.append({"name": "cause", "value": alert.cause[:1024], "inline": False})
    if alert.suggestion:
        fields.append({"name": "fix", "value": alert.suggestion[:1024], "inline": False})
    embed: dict[str, Any] = {
        "title": alert.title[:256],
        "description": (alert.message or "")[:4000],
        "color": 0x22C55E if alert.kind == "resolved" else _DISCORD_COLOR.get(alert.severity, 0x888888),
        "fields": fields,
        "footer": {"text": "steadytune"},
    }
    if alert.dashboard_url:
        embed["url"] = alert.dashboard_url
    return {"content": alert.title[:2000], "embeds": [embed]}


PAYLOADS = {"generic": generic_payload, "slack": slack_payload, "discord": discord_payload}

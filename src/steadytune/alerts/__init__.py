"""Alerts: sinks (console, JSONL, webhook, e-mail, command) and the router (dedup, rate limit, resolve)."""

from steadytune.alerts.config import AlertsConfig
from steadytune.alerts.router import AlertRouter

__all__ = ["AlertRouter", "AlertsConfig"]

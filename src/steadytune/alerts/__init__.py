"""Alerts: sinks (console, JSONL, webhook, e-mail, command) and the router (dedup, rate limit, resolve)."""

from steadytune.alerts.router import AlertRouter
from steadytune.config.alerts import AlertsConfig

__all__ = ["AlertRouter", "AlertsConfig"]

"""Is a run's supervisor still there? Read from the ``status.json`` it rewrites about once a second.

Pure: the status (and the time of the supervisor's newest write) and the time of the reading in, a
yes or no out. The dashboard, ``/metrics``
and the goodput account all ask it, so a run is live for one of them when it is for the others.
"""

from __future__ import annotations

from typing import Any

LIVE_STATES = frozenset({"starting", "running", "restarting", "paused"})
# A supervisor that has not rewritten status.json for this long is presumed gone. A time as far
# ahead of the reading is no supervisor's either (a hand-edited or restored file, a clock set wrong):
# ``updated_ts: 9e99`` kept a run "running" on every page for good, never indexed, never settled.
STALE_STATUS_S = 15.0


def status_live(status: dict[str, Any], now: float) -> bool:
    """Whether ``status`` (a run's ``status.json``) is a live supervisor's, read at ``now``."""
    updated = status.get("updated_ts")
    return (
        status.get("state") in LIVE_STATES
        and isinstance(updated, (int, float))
        and not isinstance(updated, bool)
        and abs(now - updated) < STALE_STATUS_S
    )


def run_live(status: dict[str, Any] | None, newest_write: float | None, now: float) -> bool:
    """Whether a run's supervisor is there, given its ``status.json`` (None when it has none yet)
    and the time its files (config, events, plan, streams) were last written.

    A supervisor writes its config and ``run_started`` event before its first ``status.json``: in
    those first seconds a run without one is live while those writes are fresh.
    """
    if status is not None:
        return status_live(status, now)
    return newest_write is not None and abs(now - newest_write) < STALE_STATUS_S

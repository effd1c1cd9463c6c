"""What every request of one dashboard shares: the runs, the bind, the token, the limits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from steadytune.web.runs import RunsIndex


@dataclass
class DashboardApp:
    """Everything a request handler needs; one per server."""

    index: RunsIndex
    host: str
    port: int
    token: str | None
    clock: Callable[[], float] = time.time
    poll_s: float = 0.25
    stopping: threading.Event = field(default_factory=threading.Event)
    # Reachable from other machines: reads need the token too (see security.reads_need_token).
    exposed: bool = False
    public_url: str | None = None
    machine_names: frozenset[str] = frozenset()
    max_streams: int = 16
    # The GPU server's daemon (snapshot() and act(op, job)), when `steadytune server` serves the dashboard.
    server: Any = None
    # /metrics leaves out the series of runs that ended longer ago than this (web/metrics.py exported).
    metrics_keep_finished_s: float = 24 * 3600.0
    streams: threading.BoundedSemaphore = field(init=False)

    def __post_init__(self) -> None:
        self.streams = threading.BoundedSemaphore(self.max_streams)

    def indexer(self, interval_s: float = 0.2) -> None:
        """Keep the indexes of supervisor-less runs fresh, off the request path (quiet runs less often)."""
        while not self.stopping.wait(interval_s):
            self.index.refresh_due()

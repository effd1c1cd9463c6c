"""Waiting on conditions, never on the clock: a loaded machine makes any fixed delay too short."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# How long a test lets a local server (a dashboard, a webhook, an SMTP relay, Prometheus) take over one
# answer: a bound, not a sleep, so it costs nothing when the answer comes, and a loaded machine can
# take seconds. A test whose subject is a timeout states its own.
ANSWER_S = 60.0


def wait_for(
    predicate: Callable[[], T], timeout: float = 120, what: str = "condition", interval: float = 0.05
) -> T:
    """The first truthy value of ``predicate()``, polled until ``timeout`` seconds have passed.

    The timeout is only a backstop for a test that would otherwise hang: it is meant
    to be generous, and nothing is asserted about how soon the condition came true.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)

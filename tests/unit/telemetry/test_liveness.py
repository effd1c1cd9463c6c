"""Is a run's supervisor there: a status rewritten within the last seconds, and not from the future."""

from __future__ import annotations

import pytest

from steadytune.telemetry.liveness import STALE_STATUS_S, run_live, status_live

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("age", "live"),
    [(0.0, True), (STALE_STATUS_S / 2, True), (STALE_STATUS_S * 2, False),
     (-STALE_STATUS_S / 2, True),  # a clock a little ahead: still live
     (-STALE_STATUS_S * 2, False), (-1e99, False)],  # far ahead: a hand-edited or restored file
)  # fmt: skip
def test_a_status_is_live_only_near_the_reading(age: float, live: bool) -> None:
    status = {"state": "running", "updated_ts": NOW - age}
    assert status_live(status, NOW) is live
    assert run_live(status, None, NOW) is live
    assert run_live(None, NOW - age, NOW) is live


def test_an_ended_state_is_never_live() -> None:
    assert not status_live({"state": "completed", "updated_ts": NOW}, NOW)

"""``repro --check``'s verdict: it claims only what a replay can reproduce, the step's values."""

from __future__ import annotations

from typing import Any

import pytest

from steadytune.forensics.replaystep import StepOutcome, _verdict


def _meta(*anomalies: tuple[str, str | None]) -> dict[str, Any]:
    events = [
        {"kind": "anomaly", "name": name, "step": 9, "data": {"metric": metric} if metric else {}}
        for name, metric in anomalies
    ]
    return {"step": 9, "start_step": 0, "events_at_step": events, "replay": [{"step": 9}]}


def _matching(loss: float = 3.0) -> list[StepOutcome]:
    return [StepOutcome(9, loss, 1.5, loss, 1.5, matches=True)]


@pytest.mark.parametrize(("name", "metric"), [("throughput_drop", "tokens_per_s"), ("stall", None),
                                              ("memory_headroom_low", "gpu_mem_reserved")])  # fmt: skip
def test_a_machine_anomaly_is_not_called_reproduced_by_a_matching_loss(name: str, metric: str | None) -> None:
    notes: list[str] = []
    res = _verdict(_meta((name, metric)), None, _matching(), notes)
    assert res.verdict == "healthy" and "REPRODUCED" not in res.message
    assert res.message.startswith("NO ANOMALY in its values")
    assert any(name in n and "does not measure" in n for n in notes)


@pytest.mark.parametrize(
    ("name", "metric"), [("loss_spike", "loss"), ("grad_explosion", "grad_norm/layers.0"), ("nan_loss", None)]
)
def test_an_anomaly_of_the_steps_values_is_reproduced_when_they_match(name: str, metric: str | None) -> None:
    # Beside a machine anomaly at the same step, only the value anomaly is named.
    res = _verdict(_meta((name, metric), ("throughput_drop", "tokens_per_s")), None, _matching(), [])
    assert res.verdict == "reproduced"
    assert res.message.startswith(f"REPRODUCED ({name})")

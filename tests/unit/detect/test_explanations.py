"""What an anomaly says of its cause and fix follows the evidence: no "the loss did not" beside a loss
spike, no "did not come back" for an excursion that came back, no nvidia-smi for a CPU-only run."""

from __future__ import annotations

import dataclasses

import pytest

from steadytune.config.detect import DetectConfig, PaceConfig
from steadytune.detect.offline import detect, in_hindsight
from steadytune.records import Anomaly
from tests.unit.detect.helpers import feed, noisy, raised, records
from tests.unit.detect.test_pace import _times


def _anomaly(kind: str, start: int, end: int, rank: int | None = None) -> Anomaly:
    return Anomaly(kind, "warning", start, end, "x", cause="usual", rank=rank)


def test_a_grad_spike_with_a_loss_spike_at_its_steps_does_not_say_the_loss_stayed() -> None:
    grad = _anomaly("grad_spike", 40, 40)
    with_loss = in_hindsight(grad, True, [grad, _anomaly("loss_spike", 40, 42)])
    alone = in_hindsight(
        grad, True, [grad, _anomaly("loss_spike", 60, 62), _anomaly("loss_spike", 40, 40, rank=3)]
    )
    assert "the loss did not" not in with_loss.cause and "with the loss" in with_loss.cause
    assert "while the loss did not" in alone.cause


@pytest.mark.parametrize("came_back", [True, False])
def test_a_divergence_says_whether_it_came_back(came_back: bool) -> None:
    div = _anomaly("divergence", 100, 104)
    got = in_hindsight(div, came_back, [div])
    assert ("then came back" in got.cause) is came_back
    assert "did not come back" not in got.cause


def _drop(**memory: int) -> Anomaly:
    n = 100
    recs = records(noisy(n, decay=0.02), step_time_s=_times(n, slow_from=60), tokens=[4096] * n)
    recs = [dataclasses.replace(r, **memory) for r in recs]
    cfg = DetectConfig(pace=PaceConfig(throughput_min_s=0))
    return next(a for a in raised(feed(recs, cfg)) if a.kind == "throughput_drop")


def test_a_throughput_drop_on_a_cpu_run_does_not_send_to_nvidia_smi() -> None:
    assert "nvidia-smi" not in _drop(rss_bytes=2 << 30).suggestion
    assert "nvidia-smi" in _drop(mem_allocated_bytes=8 << 30, rss_bytes=2 << 30).suggestion


def test_analyze_tells_a_grad_spike_that_came_with_a_loss_spike() -> None:
    n = 120
    loss = noisy(n, decay=0.02)
    grad = [1.0 + 0.02 * (i % 5) for i in range(n)]
    loss[80] *= 3.0  # step 81
    grad[80] *= 30.0
    found = detect(records(loss, grad))
    # 30x with the loss is an explosion, the spike one face of it: one episode, told with the loss.
    spikes = [a for a in found if a.kind in ("grad_spike", "grad_explosion")]
    assert [a.kind for a in spikes] == ["grad_explosion"]
    assert any(a.kind == "loss_spike" and a.start_step == 81 for a in found)
    assert all("with the loss" in a.cause for a in spikes)

"""The detector registry: one shape for every detector, words for every kind, one entry to add one."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import ClassVar

from steadytune.config.detect import DetectConfig
from steadytune.detect import KINDS, LiveDetector, build
from steadytune.detect.base import Finding, Reporter
from steadytune.detect.points import RankStep, Signal, SystemPoint, Tick
from steadytune.records import StepRecord

FEEDS = {Signal, RankStep, SystemPoint, Tick}


def test_every_detector_has_the_one_shape() -> None:
    for d in build.all_detectors(DetectConfig()):
        params = list(inspect.signature(d.observe).parameters)
        assert params == ["point", "out"], f"{type(d).__name__}.observe{tuple(params)}"
        assert d.reports and set(d.reports) <= set(KINDS), type(d).__name__


def test_every_kind_has_words_a_detector_and_a_config_section() -> None:
    reported = {k for d in build.all_detectors(DetectConfig()) for k in d.reports}
    assert reported == set(KINDS) == set(DetectConfig.kind_names())
    assert len(DetectConfig.kind_names()) == len(set(DetectConfig.kind_names()))


def test_every_entry_observes_known_feeds_and_fills_its_limits_from_config() -> None:
    names = [e.name for e in build.REGISTRY]
    assert len(names) == len(set(names))
    for e in build.REGISTRY:
        assert e.feeds and set(e.feeds) <= FEEDS, e.name
        for cls in e.limits:
            assert dataclasses.is_dataclass(cls)
            build.fill(cls, DetectConfig(), e.sections)  # raises on a field no section names


def test_the_series_run_before_the_rules_that_read_them() -> None:
    """Rules read the loss series' verdict and the grad series' state of the same step."""
    signal = [e.name for e in build.REGISTRY if Signal in e.feeds]
    assert signal.index("loss") < signal.index("grad") < signal.index("short_rise")
    for rule in ("fall_collapse", "plateau", "oscillation", "overfit"):
        assert signal.index("short_rise") < signal.index(rule)


@dataclass(frozen=True, slots=True)
class _AboveLimits:
    collapse_small: float  # any detect.loss field serves: the limits are filled by name


class _LossAbove:
    """A detector added by one class and one entry: the engine feeds it without a change."""

    reports: ClassVar[tuple[str, ...]] = ("loss_spike",)

    def __init__(self, limits: _AboveLimits) -> None:
        self.rep, self.limit = Reporter(None), 1.0 / limits.collapse_small

    def observe(self, point: Signal, out: list[Finding]) -> None:
        loss = point.rec.loss
        if loss is not None:
            self.rep.report(out, "loss_spike", "loss_above", point.rec.step, loss > self.limit)


def test_a_detector_is_added_by_its_entry_alone() -> None:
    entry = build.Entry("loss_above", _LossAbove, (Signal,), (_AboveLimits,), ("loss",))
    det = LiveDetector(DetectConfig(), registry=(*build.REGISTRY, entry))
    losses = [2.0] * 5 + [25.0, 26.0] + [2.0] * 5
    seen = []
    for i, loss in enumerate(losses, 1):
        seen += [
            (t.state, t.anomaly.metric, t.anomaly.start_step)
            for t in det.observe_step(StepRecord(i, float(i), loss=loss))
        ]
    assert ("raised", "loss_above", 6) in seen and ("cleared", "loss_above", 6) in seen
    cfg = DetectConfig.model_validate({"loss": {"collapse_small": 0.02}})  # the limit moves to 50
    det = LiveDetector(cfg, registry=(*build.REGISTRY, entry))
    quiet = [
        t for i, loss in enumerate(losses, 1) for t in det.observe_step(StepRecord(i, float(i), loss=loss))
    ]
    assert not [t for t in quiet if t.anomaly.metric == "loss_above"]

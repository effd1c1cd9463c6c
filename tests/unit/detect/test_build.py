"""detect/build.py: every threshold reaches a detector, and a detector needs no config to be built."""

from __future__ import annotations

import pickle

import pytest
from pydantic import BaseModel

from steadytune.config.detect import DetectConfig
from steadytune.detect import build
from steadytune.detect.base import Finding
from steadytune.detect.gradflow import FlowLimits, GradFlowWatch
from steadytune.detect.memory import HeadroomLimits, HeadroomWatch
from steadytune.detect.pace import StallLimits, StallWatch
from steadytune.detect.points import RankStep, Signal
from steadytune.detect.stats import Tracker
from steadytune.records import StepRecord

# Read by the live engine itself, not by a detector: the switch, the filter, the gap that makes
# a condition firing again the same episode, and the device size that overrides what system
# samples report.
ENGINE_FIELDS = {"enabled", "disabled_kinds", "episode_gap_points", "memory.device_total_bytes"}


def _detectors(cfg: DetectConfig) -> list[object]:
    return list(build.all_detectors(cfg))


def _paths() -> set[str]:
    cfg, out = DetectConfig(), set()
    for name in DetectConfig.model_fields:
        sub = getattr(cfg, name)
        if isinstance(sub, BaseModel):
            out.update(f"{name}.{f}" for f in type(sub).model_fields)
        else:
            out.add(name)
    return out


def _changed(cfg: DetectConfig, path: str) -> DetectConfig:
    section, name = path.split(".")
    sub = getattr(cfg, section)
    value = getattr(sub, name)
    new = 123.0 if value is None else (value + 1 if isinstance(value, int) else value * 1.37)
    # model_copy skips validation: a share nudged past 1 is still a different number to pass on.
    return cfg.model_copy(update={section: sub.model_copy(update={name: new})})


@pytest.mark.parametrize("path", sorted(_paths() - ENGINE_FIELDS))
def test_every_threshold_changes_the_detectors_built(path: str) -> None:
    """A threshold mapped nowhere, or onto the wrong section's detector, leaves every detector as it was."""
    default = DetectConfig()
    before = [pickle.dumps(d) for d in _detectors(default)]
    after = [pickle.dumps(d) for d in _detectors(_changed(default, path))]
    assert before != after, f"detect.{path} reaches no detector through detect/build.py"


def test_the_engine_fields_are_still_config_fields() -> None:
    assert _paths() >= ENGINE_FIELDS


def test_detectors_are_built_from_plain_numbers() -> None:
    out: list[Finding] = []
    watch = HeadroomWatch(HeadroomLimits(headroom_warning=0.9, headroom_critical=0.97), "mem_reserved_bytes")
    watch.observe(RankStep(StepRecord(step=10, ts=0.0, mem_reserved_bytes=95), device_total=100), out)
    watch.observe(RankStep(StepRecord(step=11, ts=0.0, mem_reserved_bytes=98), device_total=100), out)
    assert [(f.kind, f.severity) for f in out] == [
        ("memory_headroom", "warning"),
        ("memory_headroom", "critical"),
    ]
    stall = StallWatch(
        StallLimits(
            stall_factor=5.0, stall_min_s=300.0, heartbeat_timeout_s=42.0, hang_floor_s=60.0, hang_factor=10.0
        )
    )
    assert stall.hang_limit_s() == 42.0
    flow = GradFlowWatch(
        FlowLimits(
            layer_vanish_norm=0.01, layer_explode_norm=10.0, layer_dead_zero_frac=0.5, zero_grad_norm=0.0
        )
    )
    layers = {"layers.0": {"norm": 0.005, "zero_frac": 0.0}, "lm_head": {"norm": 20.0, "zero_frac": 0.0}}
    flow.observe(
        Signal(
            StepRecord(step=50, ts=0.0, extra={"gradflow": layers}),
            None,
            False,
            Tracker(8, 64, 0.1, 1.0, 0.01),
        ),
        out,
    )
    assert [(f.kind, f.metric) for f in out[2:]] == [
        ("grad_vanishing", "grad_norm/layers.0"),
        ("grad_explosion", "grad_norm/lm_head"),
    ]

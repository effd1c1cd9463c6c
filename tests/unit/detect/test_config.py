"""DetectConfig: defaults that validate, overrides that nest, typos that fail."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from steadytune.detect import ALL_KINDS, KINDS, DetectConfig


def test_defaults_and_nested_override() -> None:
    cfg = DetectConfig.model_validate({"loss": {"spike_z": 9}, "memory": {"device_total_bytes": 1 << 30}})
    assert cfg.loss.spike_z == 9 and cfg.loss.divergence_points == DetectConfig().loss.divergence_points
    assert cfg.memory.device_total_bytes == 1 << 30


@pytest.mark.parametrize("bad", [{"los": {}}, {"loss": {"spike_zz": 1}}, {"loss": {"spike_z": -1}}])
def test_unknown_keys_and_bad_values_are_errors(bad: dict) -> None:
    with pytest.raises(ValidationError):
        DetectConfig.model_validate(bad)


def test_every_kind_of_the_issue_has_words() -> None:
    expected = {
        "nan_loss",
        "nonfinite_grad",
        "loss_spike",
        "divergence",
        "loss_collapse",
        "plateau",
        "oscillation",
        "grad_explosion",
        "grad_vanishing",
        "grad_spike",
        "memory_leak",
        "memory_headroom",
        "throughput_drop",
        "stall",
        "straggler",
        "gpu_thermal",
        "gpu_error",
        "dataloader_bottleneck",
        "disk_low",
        "overfitting",
        "nan_eval",
        "reward_collapse",
        "kl_blowup",
        "no_learning_signal",
        "clip_saturation",
    }
    assert set(ALL_KINDS) == expected
    for info in KINDS.values():
        assert info.cause and info.suggestion and info.severity in ("info", "warning", "critical")

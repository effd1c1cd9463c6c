from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steadytune.records import (
    BatchFingerprint,
    Event,
    GpuSample,
    PlanRevision,
    StepRecord,
    SystemSample,
    from_dict,
    from_json,
    run_end,
    to_dict,
    to_json,
)


def test_step_record_round_trip_keeps_nan_and_inf() -> None:
    rec = StepRecord(
        step=3,
        ts=1.5,
        loss=math.nan,
        grad_norm=math.inf,
        lr=1e-4,
        batch=BatchFingerprint((1, 2), ("ab", "cd")),
        extra={"x": 1},
    )
    back = from_json(to_json(rec))
    assert isinstance(back, StepRecord)
    assert math.isnan(back.loss) and back.grad_norm == math.inf
    assert back.batch == rec.batch and back.extra == {"x": 1}
    assert '"loss":"nan"' in to_json(rec)  # valid JSON: no bare NaN token


def test_nested_and_tuple_fields_round_trip() -> None:
    sample = SystemSample(ts=1.0, cpu_ratio=0.5, gpus=(GpuSample(index=0, name="H100", temperature_c=71.0),))
    assert from_json(to_json(sample)) == sample
    plan = PlanRevision(revision=2, ts=2.0, reason="loss_spike", skip_ranges=((10, 20),), lr_scale=0.5)
    assert from_json(to_json(plan)) == plan
    ev = Event(ts=1.0, kind="anomaly", name="loss_spike", severity="critical", step=5, data={"z": 9.1})
    assert from_json(to_json(ev)) == ev


def test_unknown_type_is_a_clear_error_and_unknown_fields_are_ignored() -> None:
    with pytest.raises(ValueError, match="unknown record type 'bogus'"):
        from_dict({"type": "bogus"})
    rec = from_dict({"type": "step", "step": 1, "ts": 0.0, "added_by_a_newer_writer": 1})
    assert isinstance(rec, StepRecord) and rec.step == 1


def test_each_field_is_read_back_by_its_own_rule() -> None:
    """A line as another writer may spell it: every field's rule applies to that field alone."""
    huge = int("9" * 400)  # JSON's integer with no float: the detectors need one
    line = {
        "type": "step", "step": 7, "ts": 3, "loss": huge, "grad_norm": "-inf", "lr": 2, "epoch": "inf",
        "tokens": huge, "extra": {"big": -huge, "text": "inf", "n": 3},
        "batch": {"indices": [4, 5], "hashes": ["a", "b"]}, "newer_field": "nan",
    }  # fmt: skip
    rec = from_dict(line)
    assert isinstance(rec, StepRecord)
    assert rec.loss == math.inf and rec.grad_norm == -math.inf and rec.lr == 2 and rec.ts == 3
    assert rec.epoch is None  # an infinite epoch says nothing of where the data is
    assert rec.tokens == huge  # not a float field: kept as written
    assert rec.extra == {"big": -math.inf, "text": "inf", "n": 3}
    assert rec.batch == BatchFingerprint((4, 5), ("a", "b"))
    for bad in ("7", True, 2**60, 1.0):
        with pytest.raises(ValueError, match="is not an integer"):
            from_dict({**line, "step": bad})
    gpu = {"index": 0, "name": "g", "util_ratio": 0.5}
    sample = from_dict({"type": "system", "ts": 1.0, "gpus": [gpu]})
    assert isinstance(sample, SystemSample) and sample.gpus == (GpuSample(index=0, name="g", util_ratio=0.5),)
    pairs = {"skip_ranges": [[1, 2]], "skip_steps": [[3, 4]], "lr_groups": [["head", 1]]}
    plan = from_dict({"type": "plan", "revision": 1, "ts": 1.0, "reason": "r", **pairs})
    assert isinstance(plan, PlanRevision) and plan.skip_ranges == ((1, 2),) and plan.skip_steps == ((3, 4),)
    assert plan.lr_groups == (("head", 1.0),)


def test_tokens_per_second() -> None:
    assert StepRecord(step=1, ts=0, tokens=1000, step_time_s=0.5).tokens_per_s == 2000
    assert StepRecord(step=1, ts=0, tokens=1000).tokens_per_s is None


_finite_or_not = st.floats() | st.none()
_texts = st.text(max_size=12)  # any code point: the line must stay ASCII-escaped as json.dumps writes it


@settings(max_examples=300, deadline=None)
@given(
    step=st.integers(min_value=-(2**70), max_value=2**70),
    ts=st.floats(),
    loss=_finite_or_not,
    grad_norm=_finite_or_not,
    tokens=st.integers(min_value=0) | st.none(),
    skipped=st.booleans(),
    batch=st.none() | st.builds(BatchFingerprint, st.tuples(st.integers()), st.tuples(_texts)),
    extra=st.dictionaries(_texts, st.integers() | st.floats() | _texts | st.booleans(), max_size=3),
)
def test_step_line_is_the_text_json_dumps_writes(
    step: int,
    ts: float,
    loss: float | None,
    grad_norm: float | None,
    tokens: int | None,
    skipped: bool,
    batch: BatchFingerprint | None,
    extra: dict[str, object],
) -> None:
    rec = StepRecord(
        step=step,
        ts=ts,
        loss=loss,
        grad_norm=grad_norm,
        tokens=tokens,
        skipped=skipped,
        batch=batch,
        extra=extra,
    )
    assert to_json(rec) == json.dumps(to_dict(rec), separators=(",", ":"))


def test_the_run_end_is_the_lifecycle_event_not_the_alert_that_tells_of_it() -> None:
    """The alert router files a delivery under the name of the event it told of, after it."""
    events = [
        Event(ts=1.0, kind="lifecycle", name="run_started"),
        Event(ts=5.0, kind="lifecycle", name="run_stopped", step=7, data={"signal": "SIGTERM"}),
        Event(ts=6.0, kind="alert", name="run_stopped", step=7, data={"delivered": ["console"]}),
    ]
    assert run_end(events) is events[1]
    assert run_end(events[:1]) is None and run_end([events[0], events[2]]) is None

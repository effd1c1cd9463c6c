"""Autoscaling rules: readings with timestamps in, resize decisions out, exact on an injected clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.config.load import ConfigError, load_config
from steadytune.config.scale import ScaleConfig
from steadytune.policy.scale import (
    Reading,
    ScaleRules,
    Shape,
    job_reading,
    keep_effective_batch,
    parse_visible,
)
from steadytune.records import GpuSample
from steadytune.telemetry.snapshot import SnapshotSampler, read_snapshot, sampler_from_env


def rules(**cfg: object) -> ScaleRules:
    base = {
        "min_gpus": 1,
        "max_gpus": 4,
        "grow": {"gpu_util_above": 85, "for_s": 10},
        "shrink": {"gpu_util_below": 30, "for_s": 20},
        "cooldown_s": 100,
        "compare_steps": 4,
    }
    return ScaleRules(
        ScaleConfig.model_validate({**base, **cfg}), Shape(micro_batch=2, accumulation=4, world=1)
    )


def feed(r: ScaleRules, util: float, t0: float, t1: float, cpu: float | None = 10.0, training: bool = True):
    """One reading a second over [t0, t1]; the decisions that came out, with their times."""
    out = []
    for t in range(int(t0), int(t1) + 1):
        d = r.observe(Reading(float(t), util, cpu, gpus_available=4), training)
        if d is not None:
            out.append((t, d))
    return out


def steps(r: ScaleRules, attempt: int, first: int, n: int, t0: float, dt: float):
    """``n`` steps ``dt`` apart; the verdicts that came out."""
    return [v for i in range(n) if (v := r.observe_step(t0 + i * dt, first + i, attempt)) is not None]


def test_grow_fires_once_the_rule_held_for_its_time_and_keeps_the_effective_batch() -> None:
    r = rules()
    got = feed(r, 95, 0, 15)
    assert [t for t, _ in got] == [10]  # held from t=0, for 10 s
    d = got[0][1]
    assert (d.kind, d.before.world, d.after.world) == ("grow", 1, 2)
    assert d.after.accumulation == 2 and d.after.effective_batch == d.before.effective_batch == 8
    assert "95% > 85% for 10s" in d.reason


def test_a_dip_restarts_the_clock_and_so_does_a_worker_that_is_not_training() -> None:
    r = rules()
    assert feed(r, 95, 0, 8) == []
    assert feed(r, 50, 9, 9) == []  # below the threshold once: the streak starts over
    assert feed(r, 95, 10, 18) == []
    assert feed(r, 95, 19, 19, training=False) == []  # loading/saving idles the GPUs: not judged
    got = feed(r, 95, 20, 40)
    assert [t for t, _ in got] == [30]


def test_an_unavailable_reading_holds_no_rule() -> None:
    r = rules()
    assert feed(r, None, 0, 60) == []  # type: ignore[arg-type]


def test_at_most_one_resize_per_cooldown() -> None:
    r = rules(undo_if_slower=False)
    d = feed(r, 95, 0, 10)[0][1]
    r.applied(d, 10.0)
    steps(r, 1, 5, 7, 11.0, 1.0)  # measured: the judging is over
    got = feed(r, 95, 11, 200)
    assert [t for t, _ in got] == [110]  # cooldown 100 s from the resize at t=10
    assert got[0][1].after.world == 4  # 3 cannot keep the effective batch of 8: the next size that can


def test_a_size_that_cannot_keep_the_effective_batch_is_refused_with_the_reason_once() -> None:
    r = ScaleRules(
        ScaleConfig(min_gpus=1, max_gpus=3, grow={"gpu_util_above": 85, "for_s": 5}),
        Shape(micro_batch=4, accumulation=1, world=1),
    )
    got = feed(r, 99, 0, 30)
    assert len(got) == 1
    d = got[0][1]
    assert d.refused and "effective batch 4 (4 x 1 x 1) is not a multiple of 4 x 2" in d.refused
    assert d.after == d.before


def test_shrink_grows_accumulation_and_never_below_min_gpus() -> None:
    r = ScaleRules(
        ScaleConfig(min_gpus=2, max_gpus=4, shrink={"gpu_util_below": 30, "for_s": 5}),
        Shape(micro_batch=2, accumulation=1, world=4),
    )
    d = feed(r, 5, 0, 5)[0][1]
    assert d.kind == "shrink"
    # 3 processes cannot keep 8 (2 x 1 x 4): the largest smaller size that can is 2, accumulation 2.
    assert (d.after.world, d.after.accumulation) == (2, 2)
    r.applied(d, 5.0)
    assert feed(r, 5, 200, 400) == []  # at min_gpus


def test_grow_is_bounded_by_the_gpus_the_job_may_use() -> None:
    r = rules()
    out = [r.observe(Reading(float(t), 95.0, 10.0, gpus_available=1), True) for t in range(30)]
    assert out == [None] * 30


def test_cpu_bound_adds_workers_not_gpus() -> None:
    r = rules(cpu_bound={"cpu_util_above": 90, "gpu_util_below": 50, "for_s": 5, "max_workers": 4})
    got = feed(r, 20, 0, 10, cpu=97)  # GPUs idle (shrink would hold at 20 s), CPUs saturated
    assert [t for t, _ in got] == [5]
    d = got[0][1]
    assert (d.kind, d.before.workers, d.after.workers, d.after.world) == ("more_workers", 0, 2, 1)
    assert "input pipeline" in d.reason


def test_a_grow_that_did_not_pay_off_is_undone_and_not_tried_again() -> None:
    r = rules()
    steps(r, 0, 1, 8, 0.0, 1.0)  # 1 s a step at 8 samples: 8 samples/s
    d = feed(r, 95, 10, 20)[0][1]
    r.applied(d, 20.0)
    # The new attempt's first two steps warm up and are not measured; then 4 steps at 0.98 s.
    verdicts = steps(r, 1, 9, 6, 30.0, 0.98)
    assert len(verdicts) == 1
    v = verdicts[0]
    assert not v.kept and v.undo is not None
    assert v.before_samples_per_s == pytest.approx(8.0)
    assert v.after_samples_per_s == pytest.approx(8 / 0.98)  # +2%: below the 5% a grow must show
    assert (v.undo.kind, v.undo.after.world, v.undo.after.accumulation) == ("undo", 1, 4)
    r.applied(v.undo, 40.0)
    assert feed(r, 95, 41, 400) == []  # the undone 1 -> 2 is not tried again


def test_a_grow_that_paid_off_stays() -> None:
    r = rules()
    steps(r, 0, 1, 8, 0.0, 1.0)
    d = feed(r, 95, 10, 20)[0][1]
    r.applied(d, 20.0)
    v = steps(r, 1, 9, 6, 30.0, 0.6)[0]
    assert v.kept and v.undo is None and v.after_samples_per_s == pytest.approx(8 / 0.6)


def test_a_shrink_is_judged_per_gpu() -> None:
    r = ScaleRules(
        ScaleConfig(min_gpus=1, max_gpus=2, shrink={"gpu_util_below": 30, "for_s": 5}, compare_steps=3),
        Shape(micro_batch=2, accumulation=1, world=2),
    )
    steps(r, 0, 1, 6, 0.0, 1.0)  # 4 samples/s on 2 GPUs: 2 per GPU
    d = feed(r, 10, 10, 15)[0][1]
    r.applied(d, 15.0)
    v = steps(r, 1, 7, 5, 20.0, 1.5)[0]  # 2.67 samples/s on 1 GPU: more per GPU, kept
    assert v.kept and "per GPU" in v.reason


def test_no_undo_when_switched_off_but_the_verdict_is_still_given() -> None:
    r = rules(undo_if_slower=False)
    steps(r, 0, 1, 8, 0.0, 1.0)
    d = feed(r, 95, 10, 20)[0][1]
    r.applied(d, 20.0)
    v = steps(r, 1, 9, 6, 30.0, 2.0)[0]
    assert not v.kept and v.undo is None


def test_keep_effective_batch() -> None:
    assert keep_effective_batch(Shape(4, 2, 1), 2) == (1, "")
    assert keep_effective_batch(Shape(4, 1, 2), 1) == (2, "")
    accum, why = keep_effective_batch(Shape(4, 1, 2), 3)
    assert accum is None and "8 (4 x 1 x 2)" in why


def test_job_reading_takes_the_jobs_own_gpus() -> None:
    gpus = (GpuSample(0, util_ratio=0.1), GpuSample(1, util_ratio=0.9), GpuSample(2, util_ratio=0.7))
    r = job_reading(5.0, 0.5, gpus, world=2, visible=[1, 2])
    assert r.gpu_util == pytest.approx(80.0) and r.cpu_util == 50.0 and r.gpus_available == 2
    assert job_reading(5.0, None, gpus, world=1).gpu_util == pytest.approx(10.0)
    assert job_reading(5.0, None, (GpuSample(0),), world=1).gpu_util is None
    assert job_reading(5.0, None, (), world=1).gpus_available is None
    assert (
        parse_visible("2, 3") == [2, 3] and parse_visible("GPU-abc") is None and parse_visible(None) is None
    )


def test_config_errors_name_the_key_and_the_fix(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"text": "x"}\n')
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "model: {name_or_path: gpt2}\ndata: {train_file: t.jsonl}\nrun: {nproc_per_node: 3}\n"
        "scale: {min_gpus: 1, max_gpus: 2, grow: {gpu_util_above: 20}, shrink: {gpu_util_below: 30}}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, check_paths=False)
    text = err.value.render() if hasattr(err.value, "render") else str(err.value)
    assert "scale.shrink" in text and "keep a gap" in text
    cfg.write_text(
        "model: {name_or_path: gpt2}\ndata: {train_file: t.jsonl}\nrun: {nproc_per_node: 3}\n"
        "scale: {min_gpus: 1, max_gpus: 2}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, check_paths=False)
    text = err.value.render() if hasattr(err.value, "render") else str(err.value)
    assert "run.nproc_per_node=3 is outside scale.min_gpus..scale.max_gpus (1..2)" in text


def test_the_snapshot_file_stands_for_the_cpu_and_gpus(tmp_path: Path) -> None:
    snap = tmp_path / "snap.json"
    sampler = sampler_from_env(tmp_path, clock=lambda: 7.0, environ={"STEADYTUNE_SYSTEM_SNAPSHOT": str(snap)})
    assert isinstance(sampler, SnapshotSampler)
    s = sampler.sample()
    assert s.ts == 7.0 and s.cpu_ratio is None and s.gpus == ()  # no file yet: no reading
    assert s.disk_total_bytes  # the rest is the machine's
    snap.write_text(json.dumps({"cpu_ratio": 0.5, "gpus": [{"index": 0, "util_ratio": 0.95, "bogus": 1}]}))
    s = sampler.sample()
    assert s.cpu_ratio == 0.5 and s.gpus == (GpuSample(0, util_ratio=0.95),)
    snap.write_text('{"cpu_ratio": 0.5, "gpus": [{"index": 0, "util_')  # half written
    assert read_snapshot(snap) == (None, ())
    assert not isinstance(sampler_from_env(tmp_path, environ={}), SnapshotSampler)


def test_a_shrink_the_server_asks_for_needs_no_for_s_nor_cool_down_but_keeps_the_batch():
    r = rules(min_gpus=1)
    r.applied(_grown(r, 4), 0.0)  # 2 x 1 x 4: the cool-down (100 s) has just begun
    assert "not a multiple" in (r.shrink_onto(3, "room").refused or "")  # 8 samples over 3 x 2
    d = r.shrink_onto(2, "the server asks for room")
    assert d.refused is None and (d.after.world, d.after.accumulation) == (2, 2)
    assert d.after.effective_batch == d.before.effective_batch == 8
    assert "the server asks for room: 4 -> 2 processes" in d.reason
    assert r.observe(Reading(1.0, 95.0, 10.0, gpus_available=4), True) is None  # asked: nothing else now
    r.applied(d, 2.0)
    assert "outside scale.min_gpus 1 .. 1" in (r.shrink_onto(2, "again").refused or "")


def _grown(r: ScaleRules, world: int):
    from dataclasses import replace

    from steadytune.policy.scale import ScaleDecision

    eff = r.shape.effective_batch
    return ScaleDecision(
        "grow", r.shape, replace(r.shape, world=world, accumulation=eff // (2 * world)), "test"
    )

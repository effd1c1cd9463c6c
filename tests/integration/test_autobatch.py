"""``per_device_train_batch_size: auto`` on the demo model, under a memory cap, with real steps.

On a CPU the cap stands in for the device's memory: a probe whose measured peak exceeds
it counts as out of memory. The effective batch (micro-batch x accumulation) must come
out the same whatever the cap.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.config.load import validate_dict
from steadytune.records import PlanRevision, from_json
from steadytune.train.autobatch import AutoBatchError, find_micro_batch

from .runs import finish, run_dir, start_run, steps, write_config

pytestmark = pytest.mark.slow

MiB = 1 << 20
EFFECTIVE = 32


def demo_cfg(tmp: Path, assets: Path, cap: int | None) -> object:
    return validate_dict(
        {
            "model": {"name_or_path": str(assets / "model")},
            "method": "full",
            "data": {"train_file": str(assets / "train.jsonl"), "max_seq_length": 96},
            "train": {
                "per_device_train_batch_size": "auto",
                "auto_effective_batch": EFFECTIVE,
                "memory_cap_bytes": cap,
                "use_cpu": True,
            },
            "run": {"runs_dir": str(tmp)},
        },
        base=tmp,
    )


def test_a_tighter_cap_gives_a_smaller_micro_batch_and_the_same_effective_batch(
    tmp_path: Path, demo_assets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STEADYTUNE_MEMORY_CAP", raising=False)
    found = {}
    for cap in (20 * MiB, 12 * MiB):
        result = find_micro_batch(demo_cfg(tmp_path, demo_assets, cap))
        assert result.per_device_train_batch_size * result.gradient_accumulation_steps == EFFECTIVE
        chosen = [p for p in result.probes if p.batch == result.per_device_train_batch_size]
        assert chosen and chosen[0].fits and chosen[0].peak_bytes <= cap  # confirmed by a real step
        larger = [p for p in result.probes if p.batch > result.per_device_train_batch_size]
        assert all(not p.fits and (p.peak_bytes is None or p.peak_bytes > cap) for p in larger)
        found[cap] = result.per_device_train_batch_size
    assert found[12 * MiB] < found[20 * MiB]


def test_nothing_fits_under_a_tiny_cap_says_what_to_do(
    tmp_path: Path, demo_assets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEADYTUNE_MEMORY_CAP", "1MiB")  # the environment wins over the config
    with pytest.raises(AutoBatchError, match="gradient_checkpointing"):
        find_micro_batch(demo_cfg(tmp_path, demo_assets, 64 * MiB))


def test_supervised_run_records_the_search_as_a_plan_revision_and_a_restart_keeps_it(
    tmp_path: Path, demo_assets: Path
) -> None:
    cfg = write_config(
        tmp_path,
        demo_assets,
        train={
            "per_device_train_batch_size": "auto",
            "auto_effective_batch": EFFECTIVE,
            "memory_cap_bytes": 12 * MiB,
            "max_steps": 12,
            "save_steps": 4,
            "use_cpu": True,
        },
    )
    rc, out = finish(start_run(cfg, "auto", faults={"crash_at_step": 6, "fault_attempts": 1}))
    assert rc == 0, out
    run = run_dir(cfg, "auto")
    plans = [r for r in map(from_json, run.plan.read_text().splitlines()) if isinstance(r, PlanRevision)]
    auto = [p for p in plans if p.reason == "auto_micro_batch"]
    assert len(auto) == 1, plans  # searched once: the restart read the batch from the plan
    b, a = auto[0].per_device_train_batch_size, auto[0].gradient_accumulation_steps
    assert b is not None and a is not None and b * a == EFFECTIVE and b < EFFECTIVE
    later = plans[plans.index(auto[0]) + 1 :]
    assert later and all(
        p.per_device_train_batch_size == b and p.gradient_accumulation_steps == a for p in later
    )
    events = [json.loads(line) for line in run.events.read_text().splitlines()]
    (event,) = [e for e in events if e["name"] == "auto_micro_batch"]
    assert auto[0].cause_event_seq == event["seq"]
    assert event["data"]["effective_batch"] == EFFECTIVE and event["data"]["cap_bytes"] == 12 * MiB
    assert [p[0] for p in event["data"]["probes"] if p[2]][-1] == b
    records = steps(run)
    assert {r.attempt for r in records} == {0, 1}  # the crash was restarted
    assert {r.samples for r in records} == {EFFECTIVE}  # every optimizer step saw the same effective batch

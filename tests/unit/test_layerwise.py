"""Per-layer ranks and per-group LRs as pure functions of names, plus the plan's record of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from steadytune.config.load import ConfigError, validate_dict
from steadytune.layerwise import (
    LrGroup,
    assign_groups,
    config_group,
    group_lrs,
    layer_factor,
    overlaps,
    planned_group_lrs,
    rank_of,
    unmatched_groups,
)
from steadytune.policy.plan import rollback_plan
from steadytune.records import PlanRevision, from_json, to_json

Q0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
Q0B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"
UP1 = "base_model.model.model.layers.1.mlp.up_proj.lora_A.default.weight"
EMB, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def test_rank_pattern_matches_like_peft_first_key_wins() -> None:
    pattern = {r"layers\.0\.self_attn\.q_proj": 2, "q_proj": 8, r".*_proj": 3}
    assert rank_of("model.layers.0.self_attn.q_proj", 16, pattern) == 2
    assert rank_of("model.layers.1.self_attn.q_proj", 16, pattern) == 8
    assert rank_of("model.layers.1.mlp.up_proj", 16, pattern) == 3
    assert rank_of("model.layers.1.mlp.act", 16, pattern) == 16
    # A key must end the name at a dot boundary, as PEFT's (.*\.)?KEY$ does.
    assert rank_of("model.layers.1.self_attn.q_proj", 16, {"_proj": 5}) == 16


def test_the_first_matching_group_wins_and_lora_plus_splits_b() -> None:
    groups = [LrGroup("attn", "self_attn", 2.0), LrGroup("q", "q_proj", 10.0)]
    assert config_group(Q0, groups, None) == "attn"
    assert config_group(UP1, groups, None) == "default"
    assert config_group(Q0B, groups, 16.0) == "attn.lora_B"
    assert group_lrs(1e-3, groups, 16.0) == (
        ("default", 1e-3),
        ("default.lora_B", 1.6e-2),
        ("attn", 2e-3),
        ("attn.lora_B", 3.2e-2),
        ("q", 1e-2),
        ("q.lora_B", 0.16),
    )
    assert overlaps([Q0, Q0B, UP1], groups) == [(groups[0], groups[1], 2)]
    assert unmatched_groups([UP1], groups) == groups


def test_layer_decay_from_the_top_layer_down() -> None:
    assert layer_factor("model.layers.3.mlp.up_proj.weight", 4, 0.5) == ("layers.3", 1.0)
    assert layer_factor("model.layers.0.mlp.up_proj.weight", 4, 0.5) == ("layers.0", 0.125)
    assert layer_factor(EMB, 4, 0.5) == ("embeddings", 0.0625)
    assert layer_factor(HEAD, 4, 0.5) == (None, 1.0)
    assert layer_factor(EMB, 4, None) == (None, 1.0)
    got = assign_groups([EMB, Q0, UP1, HEAD], 1.0, [], None, 0.5)
    assert {k: lr for k, (lr, _) in got.items()} == {
        "default@embeddings": 0.25,
        "default@layers.0": 0.5,
        "default@layers.1": 1.0,
        "default": 1.0,
    }


def test_the_plan_wins_over_the_config_and_a_rollback_scales_every_group() -> None:
    groups = [LrGroup("attn", "self_attn", 2.0)]
    got = assign_groups([Q0, UP1], 1e-3, groups, None, None, planned={"attn": 5e-4, "default": 2.5e-4})
    assert {k: lr for k, (lr, _) in got.items()} == {"attn": 5e-4, "default": 2.5e-4}
    plan = PlanRevision(revision=0, ts=0.0, reason="start", lr_groups=(("default", 1e-3), ("attn", 2e-3)))
    nxt = rollback_plan(plan, 1, 1.0, 1, 10, 12, 5, "ck", {}, 0.5, None, "loss_spike")
    assert nxt.lr_groups == (("default", 5e-4), ("attn", 1e-3)) and nxt.lr_scale == 0.5
    assert from_json(to_json(nxt)) == nxt


def base(tmp_path: Path, **train: object) -> dict:
    return {
        "model": {"name_or_path": "org/model"},
        "data": {"train_file": str(tmp_path / "t.jsonl")},
        "train": train,
    }


def test_planned_group_lrs_from_the_config(tmp_path: Path) -> None:
    cfg = validate_dict(base(tmp_path, learning_rate=1e-3), tmp_path, check_paths=False)
    assert planned_group_lrs(cfg.train) == ()  # one LR: nothing extra to record
    cfg = validate_dict(
        base(
            tmp_path, learning_rate=1e-3, lr_groups=[{"match": "mlp", "lr_scale": 0.5}], loraplus_lr_ratio=4
        ),
        tmp_path,
        check_paths=False,
    )
    assert planned_group_lrs(cfg.train) == (
        ("default", 1e-3),
        ("default.lora_B", 4e-3),
        ("mlp", 5e-4),
        ("mlp.lora_B", 2e-3),
    )


def test_bad_patterns_and_groups_name_key_value_and_fix(tmp_path: Path) -> None:
    data = base(
        tmp_path,
        lr_groups=[{"match": "[", "lr_scale": 2}, {"match": "mlp", "lr_scale": 0}],
        layer_decay=1.5,
    )
    data["method"] = "full"
    data["lora"] = {"rank_pattern": {"q_proj": 0, "(": 4}}
    data["train"]["loraplus_lr_ratio"] = 16
    with pytest.raises(ConfigError) as err:
        validate_dict(data, tmp_path, check_paths=False)
    text = err.value.render()
    assert "lora.rank_pattern: '(' is not a valid regular expression" in text
    assert "rank 0 for 'q_proj' is outside 1..1024" in text
    assert "train.lr_groups.0.match: '[' is not a valid regular expression" in text
    assert "train.lr_groups.1.lr_scale" in text
    assert "Fix: use a value greater than 0: a positive multiplier of learning_rate" in text
    assert "train.layer_decay" in text and "(got 1.5)" in text
    with pytest.raises(ConfigError, match="a full fine-tune has none"):
        validate_dict({**data, "lora": {}, "train": {"loraplus_lr_ratio": 16}}, tmp_path, check_paths=True)


def test_group_names_must_be_distinct(tmp_path: Path) -> None:
    groups = [{"match": "a", "lr_scale": 2, "name": "x"}, {"match": "b", "lr_scale": 3, "name": "x"}]
    with pytest.raises(ConfigError, match="two groups are labelled 'x'"):
        validate_dict(base(tmp_path, lr_groups=groups), tmp_path, check_paths=False)
    with pytest.raises(ConfigError, match="the label 'default' is reserved"):
        validate_dict(base(tmp_path, lr_groups=[{"match": "a", "lr_scale": 2, "name": "default"}]), tmp_path)


def test_the_supervisors_rollback_changes_carry_every_groups_lower_lr(tmp_path: Path) -> None:
    from steadytune.policy.engine import Action
    from steadytune.records import Anomaly, replace
    from steadytune.supervise.restarts import first_plan, rollback_restart

    cfg = validate_dict(
        base(tmp_path, learning_rate=1e-3, lr_groups=[{"match": "attn", "lr_scale": 2, "name": "attn"}]),
        tmp_path,
        check_paths=False,
    )
    plan = first_plan(cfg, 5.0)
    assert plan.lr_groups == (("default", 1e-3), ("attn", 2e-3)) and plan.revision == 0
    spike = Anomaly("loss_spike", "critical", 25, 26, "loss")
    changes, kind, why, target = rollback_restart(
        plan, Action("rollback", "spike", 26, spike), [10, 20], [], tmp_path, 26, {}, 0.5
    )
    assert kind == "loss_spike" and target == 20 and "LR x0.5" in why
    assert changes["lr_groups"] == (("default", 5e-4), ("attn", 1e-3)) and changes["lr_scale"] == 0.5
    # The supervisor's revise() applies the changes; a second rollback halves every group again.
    again, *_ = rollback_restart(
        replace(plan, **changes),
        Action("rollback", "spike", 30, spike),
        [10, 20],
        [20],
        tmp_path,
        30,
        {},
        0.5,
    )
    assert again["lr_groups"] == (("default", 2.5e-4), ("attn", 5e-4))

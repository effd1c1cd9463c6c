"""check's checkpoint interval: save_steps against Young/Daly, from the runs folder's accounts."""

from __future__ import annotations

import math
from pathlib import Path

from steadytune.config.load import dump_config
from steadytune.goodput.parts import PARTS, Account
from steadytune.preflight.ckptinterval import checkpoint_interval_check
from steadytune.rundir import RunDir

from .conftest import make_config


def past_run(runs: Path, run_id: str, config_text: str) -> RunDir:
    run = RunDir(runs / run_id).create()
    run.config.write_text(config_text)
    run.events.write_text("")
    return run


def measured(run_id: str, wall: float, saves: int, save_s: float, interruptions: int) -> Account:
    seconds = dict.fromkeys(PARTS, 0.0)
    seconds.update(save=saves * save_s, productive=wall - saves * save_s)
    return Account(run_id, 0.0, wall, seconds, True, "completed", 100, 0, interruptions, saves, 1.0)


def record(acct: Account) -> tuple[int, float]:
    return acct.interruptions, acct.exposure_s


def test_saving_far_too_often_is_a_warning_with_the_interval_to_set(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, train={"save_steps": 5, "max_steps": 100_000})
    runs = tmp_path / "runs"
    past_run(runs, "same", dump_config(cfg))
    past_run(runs, "other", "run: {name: something-else}\n")
    # 2 s saves on 1 s steps; one interruption in 20,000 s of the two runs: about √(2·2·20000) = 283 steps.
    accounts = {
        "same": measured("same", 10_000.0, saves=50, save_s=2.0, interruptions=0),
        "other": measured("other", 10_000.0, saves=10, save_s=30.0, interruptions=1),
    }
    c = checkpoint_interval_check(
        cfg, lambda run: accounts[run.run_id], lambda run: record(accounts[run.run_id])
    )
    young = math.sqrt(2 * 2.0 * 20_000.0)
    assert (
        c.status == "warn" and c.data["measured_on"] == "same"
    )  # the other config's saves cost another price
    assert abs(c.data["best_steps"] - young) / young < 0.02
    assert c.fix == f"set train.save_steps to {c.data['best_steps']}"
    assert c.data["interruptions"] == 1 and c.data["mtbf_s"] == 20_000.0


def test_an_interval_near_the_optimum_is_ok(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, train={"save_steps": 280, "max_steps": 100_000})
    past_run(tmp_path / "runs", "same", dump_config(cfg))
    account = measured("same", 20_000.0, saves=50, save_s=2.0, interruptions=1)
    c = checkpoint_interval_check(cfg, lambda run: account, lambda run: record(account))
    assert c.status == "ok" and "save_steps 280" in c.reason


def test_without_an_earlier_save_of_this_config_it_is_not_judged(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    past_run(tmp_path / "runs", "other", "run: {name: something-else}\n")
    other = measured("other", 100.0, 2, 1.0, 1)
    c = checkpoint_interval_check(cfg, lambda run: other, lambda run: record(other))
    assert c.status == "na" and "no earlier run of this config" in c.reason

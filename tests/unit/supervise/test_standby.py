"""When a restart goes through the standby worker, and when it needs a new process (and says why).

The spares here are real worker processes, killed before they could finish their imports; a spare
that trains an attempt is tests/integration/test_standby.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadytune.config.load import ConfigError, validate_dict
from steadytune.config.schema import SteadytuneConfig
from steadytune.protocol import read_standby_orders, standby_orders
from steadytune.rundir import RunDir
from steadytune.supervise.process import WorkerProcess, worker_command
from steadytune.supervise.source import NativeSource, early_standby
from steadytune.supervise.standby import Standby, mismatch

BASE = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture
def standby(tmp_path: Path) -> Iterator[Standby]:
    sb = Standby(RunDir(tmp_path / "run").create())
    yield sb
    sb.stop()


def attempt_env(**extra: str) -> dict[str, str]:
    return {**BASE, "STEADYTUNE_ATTEMPT": "1", **extra}


def test_a_restart_the_spare_cannot_take_gets_a_new_process_and_the_reason(standby: Standby) -> None:
    root = standby.run.root
    log = standby.run.logs / "worker-1.log"
    cases = [
        (worker_command(root, 2), "several processes (torchrun)"),
        (worker_command(root, 1, python="/opt/other/bin/python"), "another Python (/opt/other/bin/python)"),
    ]
    for cmd, why in cases:
        standby.prepare(BASE)
        spare = standby.spare
        assert spare is not None
        got, reason = standby.take(cmd, attempt_env(), log)
        assert got is None and why in reason, reason
        assert spare.poll() is not None  # a spare that cannot serve is stopped, not left waiting
    # An environment the imports have already read: CUDA_VISIBLE_DEVICES is read when torch loads.
    standby.prepare(BASE)
    got, reason = standby.take(worker_command(root), attempt_env(CUDA_VISIBLE_DEVICES="3"), log)
    assert got is None and "sets CUDA_VISIBLE_DEVICES differently" in reason, reason
    standby.prepare(BASE)
    assert standby.spare is not None
    standby.spare.kill()
    got, reason = standby.take(worker_command(root), attempt_env(), log)
    assert got is None and "the standby worker had exited (exit code -9" in reason, reason
    got, reason = standby.take(worker_command(root), attempt_env(), log)
    assert got is None and reason == "no standby worker was started (the attempt before made no step)"


def test_a_spare_takes_the_variables_an_attempt_reads_late_and_nothing_else(tmp_path: Path) -> None:
    spare = WorkerProcess(
        [sys.executable, "-c", "pass"], tmp_path / "s.log", env={**BASE, "STEADYTUNE_FAULTS": "{}"}
    )
    spare.wait(60)
    cmd = [sys.executable, "-c", "pass"]
    late = {**os.environ, **BASE, "STEADYTUNE_ATTEMPT": "4", "STEADYTUNE_FAULTS": '{"nan_at_step": 3}'}
    assert mismatch(spare, cmd, late) is None
    assert "OMP_NUM_THREADS" in (mismatch(spare, cmd, {**late, "OMP_NUM_THREADS": "7"}) or "")
    assert "is not the standby worker's" in (mismatch(spare, [*cmd, "x"], late) or "")


def test_the_orders_carry_the_log_and_the_late_variables_only() -> None:
    line = standby_orders(
        Path("/r/logs/worker-3.log"), {"STEADYTUNE_ATTEMPT": "3", "STEADYTUNE_FAULTS": None}
    )
    assert read_standby_orders(line) == (
        Path("/r/logs/worker-3.log"),
        {"STEADYTUNE_ATTEMPT": "3", "STEADYTUNE_FAULTS": None},
    )
    assert "CUDA_VISIBLE_DEVICES" not in standby_orders(Path("l"), {"CUDA_VISIBLE_DEVICES": "1"})
    with pytest.raises(ValueError, match=r"may set only STEADYTUNE_ATTEMPT, STEADYTUNE_FAULTS.*'WORLD_SIZE'"):
        read_standby_orders('{"log": "l", "env": {"WORLD_SIZE": "2"}}')
    with pytest.raises(ValueError, match="standby orders must be"):
        read_standby_orders('{"env": {}}')


def test_several_processes_or_the_switch_off_mean_no_spare(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run").create()
    assert NativeSource(run, 1, standby=True).standby is not None
    two = NativeSource(run, 2, standby=True)
    assert (
        two.standby is None and two.no_standby == "run.nproc_per_node is 2: the standby worker is one process"
    )
    off = NativeSource(run, 1, standby=False)
    assert off.standby is None and off.no_standby == "recover.standby_worker is false"
    off.training()  # nothing to start
    assert off.standby_pid() is None and not (run.logs / "standby-0.log").exists()


def test_a_bad_switch_is_a_config_error_naming_key_value_and_fix() -> None:
    data = {
        "model": {"name_or_path": "m"},
        "data": {"train_file": "t"},
        "recover": {"standby_worker": "maybe"},
    }
    with pytest.raises(ConfigError) as err:
        validate_dict(data, base=Path("."), check_paths=False)
    text = str(err.value)
    assert "recover.standby_worker" in text and "'maybe'" in text and "Fix: use true" in text
    assert validate_dict({**data, "recover": {}}, base=Path("."), check_paths=False).recover.standby_worker


def test_no_early_spare_where_the_first_attempt_could_not_take_it(tmp_path: Path) -> None:
    base = {"model": {"name_or_path": "m"}, "data": {"train_file": "t"}}

    def cfg(**sections: dict) -> SteadytuneConfig:
        return validate_dict({**base, **sections}, base=Path("."), check_paths=False)

    # torchrun, and the switch off: nothing is started and no run folder is made.
    for c in (cfg(run={"nproc_per_node": 2}), cfg(recover={"standby_worker": False})):
        assert early_standby(c, RunDir(tmp_path / "new")) is None
        assert not (tmp_path / "new").exists()
    # A folder already there (another run's, say) is not written to: the run reports it as before.
    used = RunDir(tmp_path / "used").create()
    used.config.write_text("theirs")
    assert early_standby(cfg(), used) is None
    assert used.config.read_text() == "theirs" and not list(used.logs.iterdir())

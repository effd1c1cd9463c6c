"""``analyze`` on what real TRL and LLaMA-Factory print, held to the trainer_state.json they also write.

The console log is what a user keeps with ``2>&1 | tee train.log``: tqdm bars redrawn with ``\\r``,
warnings, the log dicts. Nothing in it is shaped by the test; the tool's own trainer_state.json
says which steps were logged and with which loss.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from steadytune.importers import load
from tests.integration.toolruns import tool_job

pytestmark = pytest.mark.slow


# Unbuffered, the dicts and the bar reach the file in the order printed, the bar lagging (tqdm redraws
# at most ten times a second); buffered (Python's stdout to a file, the bar on stderr), the bar runs
# ahead of the dicts. Neither may move a dict off its step.
@pytest.mark.parametrize("buffered", [False, True])
@pytest.mark.parametrize("tool", ["trl", "llamafactory"])
def test_a_tools_console_log_reads_as_its_trainer_state(
    tool: str, buffered: bool, tmp_path: Path, demo_assets: Path
) -> None:
    steps = 20
    job = tool_job(tool, demo_assets, tmp_path, steps, save_steps=steps, logging_steps=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **job.env}
    env.pop("PYTHONUNBUFFERED", None)
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    console = tmp_path / "train.log"
    with open(console, "wb") as out:
        proc = subprocess.run(job.cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=600)
    assert proc.returncode == 0, console.read_text()[-4000:]
    state = json.loads((job.checkpoint(steps) / "trainer_state.json").read_text())
    logged = {e["step"]: e for e in state["log_history"] if "loss" in e}
    series = load(console)
    assert series.format == "dict_log"
    got = {r.step: r for r in series.records if r.loss is not None}
    assert sorted(got) == sorted(logged)  # the steps, from the progress bar: none counted wrong
    for step, entry in logged.items():
        assert got[step].loss == pytest.approx(entry["loss"], rel=1e-3)
        assert got[step].grad_norm == pytest.approx(entry["grad_norm"], rel=1e-3)

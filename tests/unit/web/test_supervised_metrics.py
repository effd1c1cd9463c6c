"""``/metrics`` of a supervised command's run: its checkpoints are the job's own ``checkpoint-N``
folders, in the job's output folder, and they count as a native run's do."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from steadytune.rundir import RunDir
from steadytune.supervise.command import CommandOptions, CommandSource
from steadytune.supervise.runstate import RunState
from steadytune.supervise.status import RunBooks
from steadytune.web.metrics import STATES, render_metrics
from steadytune.web.runs import RunsIndex

NOW = 1_700_000_000.0


def _hf_checkpoint(out: Path, step: int, saved: float, whole: bool = True) -> None:
    """A checkpoint as an HF Trainer (LLaMA-Factory's) leaves it: weights, then trainer_state.json."""
    ck = out / f"checkpoint-{step}"
    ck.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    weights = len(header).to_bytes(8, "little") + header + b"\0\0\0\0"
    (ck / "adapter_model.safetensors").write_bytes(weights if whole else weights[:10])
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    os.utime(ck / "trainer_state.json", (saved, saved))


def _supervised_run(tmp_path: Path, state: str = "running", run_id: str = "job1") -> RunDir:
    """The run folder the supervisor keeps for ``steadytune supervise --output-dir out -- <job>``."""
    run = RunDir(tmp_path / "runs" / run_id).create()
    out = tmp_path / f"out-{run_id}"
    for i, step in enumerate((10, 20, 30, 40)):
        _hf_checkpoint(out, step, NOW - 400 + 100 * i)
    _hf_checkpoint(out, 50, NOW - 10, whole=False)  # a save under way
    source = CommandSource(
        CommandOptions(["llamafactory-cli", "train", "cfg.yaml"], out), run, clock=lambda: NOW
    )
    state: Any = SimpleNamespace(
        run=run,
        clock=lambda: NOW,
        status=state,
        progress=SimpleNamespace(
            step=52, max_steps=100, last_loss=1.5, last_eval_loss=None, tokens_per_s=None, eta_s=None
        ),
        attempt=SimpleNamespace(number=0, worker=None, running=lambda: True),
        planner=SimpleNamespace(total=0),
        source=source,
        started_ts=NOW - 500,
    )
    RunBooks(cast(RunState, state)).write_status(force=True)
    source.writer.close()
    return run


def _gauges(text: str) -> dict[str, float]:
    return {
        m[1]: float(m[2])
        for m in re.finditer(r"^(steadytune_checkpoint\w*)\{run=\"job1\"\} (\S+)$", text, re.M)
    }


def test_a_supervised_jobs_checkpoints_are_in_metrics(tmp_path: Path) -> None:
    run = _supervised_run(tmp_path)
    index = RunsIndex(run.root.parent)
    index.refresh_all()
    got = _gauges(render_metrics(index, lambda: NOW))
    # Four whole saves; the one still being written neither counts nor is the latest.
    assert got["steadytune_checkpoints_verified"] == 4
    assert got["steadytune_checkpoint_last_timestamp_seconds"] == NOW - 100
    assert got["steadytune_checkpoint_age_seconds"] == 100


def test_every_run_exports_the_whole_state_set_with_one_state_on(tmp_path: Path) -> None:
    """One shape for every run, whatever state its supervisor wrote: each state label, one of them 1."""
    written = ("running", "stopping", "completed", "a-state-of-a-newer-supervisor")
    for n, state in enumerate(written):
        _supervised_run(tmp_path, state, run_id=f"r{n}")
    index = RunsIndex(tmp_path / "runs")
    index.refresh_all()
    text = render_metrics(index, lambda: NOW)
    got = {
        (m[1], m[2]): float(m[3])
        for m in re.finditer(r'^steadytune_run_state\{run="(\w+)",state="([\w-]+)"\} (\S+)$', text, re.M)
    }
    for n, state in enumerate(written):
        series = {s: v for (run, s), v in got.items() if run == f"r{n}"}
        assert set(series) == set(STATES)
        assert [s for s, v in series.items() if v == 1.0] == [state if state in STATES else "unknown"]
    runs = dict(re.findall(r'^steadytune_runs\{state="(\w+)"\} (\S+)$', text, re.M))
    assert runs["unknown"] == "1.0" and runs["stopping"] == "1.0"

"""The |grad| histogram per layer: served for one gradient-flow recording, bad requests named."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

from tests.waiting import ANSWER_S, wait_for

from steadytune.records import StepRecord
from steadytune.rundir import RunDir
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web import api
from steadytune.web.runs import RunsIndex
from steadytune.web.server import start_dashboard

LAYERS = ["embeddings", "layers.0", "lm_head"]
BINS = [-4.0, -3.0, -2.0, -1.0]


def _run(runs: Path) -> None:
    run = RunDir(runs / "r1").create()
    with JsonlWriter(run.telemetry(0)) as w:
        for s in range(1, 61):
            extra = {}
            if s in (1, 50):
                # Step 50's lm_head piles up in the top bin: the histogram of that step must say so.
                top = [0, 0, 9] if s == 50 else [1, 6, 2]
                flow = {"layers": LAYERS, "norm": [0.5, 0.1, 3.0], "zero_frac": [0.9, 0.0, 0.25],
                        "hist": [[2, 5, 1], [0, 7, 3], top], "bins": BINS}  # fmt: skip
                extra = {"gradflow": flow}
            w.write(StepRecord(step=s, ts=float(s), loss=1.0, extra=extra))


def test_the_histogram_of_one_recording(tmp_path: Path) -> None:
    _run(tmp_path / "runs")
    index = RunsIndex(tmp_path / "runs", cache_dir=tmp_path / "cache")
    try:
        entry = index.get("r1")
        assert entry is not None
        entry.refresh()
        h = api.gradhist(entry, 50)
        assert h["step"] == 50 and h["layers"] == LAYERS and h["bins"] == BINS
        assert h["hist"][2] == [0, 0, 9] and h["hist"][0] == [2, 5, 1] and h["zero_frac"][2] == 0.25
        assert api.gradhist(entry, 1)["hist"][2] == [1, 6, 2]
        # A step without a recording: no histogram, said plainly.
        assert api.gradhist(entry, 7) == {"step": None, "requested": 7}
    finally:
        index.close()


def _get(port: int, path: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_S)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_the_endpoint_names_a_missing_or_bad_step(tmp_path: Path) -> None:
    _run(tmp_path / "runs")
    handle = start_dashboard(tmp_path / "runs", host="127.0.0.1", port=0)
    try:
        # The dashboard indexes the run's files in the background: the recording arrives when it has.
        body = wait_for(lambda: _get(handle.port, "/api/runs/r1/gradhist?step=50")[1].get("hist"), timeout=30,
                        what="step 50's histogram on the API")  # fmt: skip
        assert body[2] == [0, 0, 9]
        status, body = _get(handle.port, "/api/runs/r1/gradhist")
        assert status == 400 and body["param"] == "step" and "?step=50" in body["error"]
        status, body = _get(handle.port, "/api/runs/r1/gradhist?step=fifty")
        assert status == 400 and body["param"] == "step" and "'fifty'" in body["error"]
    finally:
        handle.stop()

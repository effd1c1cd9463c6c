"""The gradient-flow heat map: cell states agree with the detector, buckets keep the worst cell, the API
serves it."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from steadytune.detect.gradflow import check_layers
from steadytune.records import StepRecord
from steadytune.rundir import RunDir
from steadytune.telemetry.store import GradFlow
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web import api, heatmap
from steadytune.web.heatmap import DEAD, EXPLODING, OK, VANISHING, build, cell_state
from steadytune.web.runs import RunsIndex

LAYERS = ("embeddings", "layers.0", "layers.1", "lm_head")


def row(
    step: int, norm: list[float], zero: list[float] | None = None, layers: tuple[str, ...] = LAYERS
) -> GradFlow:
    return GradFlow(step=step, attempt=0, ts=float(step), layers=layers, norm=tuple(norm),
                    zero_frac=tuple(zero or [0.0] * len(layers)), version=step)  # fmt: skip


def test_cell_states_mark_exactly_what_check_layers_reports() -> None:
    norms = [0.0, 1e-4, 1e-3, 0.5, 100.0, 101.0, math.inf, math.nan]
    zeros = [0.0, 0.9, 0.95]
    for layer, norm, zf in itertools.product(("embeddings", "layers.3"), norms, zeros):
        flagged = check_layers({layer: {"norm": norm, "zero_frac": zf}}, **heatmap.DEFAULT_LIMITS)
        state = cell_state(layer, norm, zf)
        assert (state != OK) == bool(flagged), (layer, norm, zf, state, flagged)
        if flagged:
            assert (state == EXPLODING) == (flagged[0].kind == "grad_explosion"), (layer, norm, zf)
    assert cell_state("layers.0", 1e-4, 0.95) == VANISHING and cell_state("layers.0", 0.5, 0.95) == DEAD
    assert cell_state("embeddings", 0.5, 0.99) == OK  # sparse embedding gradients are normal
    assert cell_state("layers.0", None, 0.0) is None


def test_build_one_column_per_recording_with_states() -> None:
    hm = build([row(1, [0.5, 2.0, 1e-5, math.nan]), row(50, [0.4, 1.5, 0.2, 250.0], [0.99, 0.95, 0.0, 0.0])])
    assert hm["layers"] == list(LAYERS) and hm["bucket"] == 1 and hm["total"] == 2
    c1, c50 = hm["columns"]
    assert (c1["first"], c1["last"], c1["n"]) == (1, 1, 1)
    assert c1["norm"] == [0.5, 2.0, 1e-5, "nan"]  # JSON-safe: a non-finite norm is named, not dropped
    assert c1["state"] == [OK, OK, VANISHING, EXPLODING]
    assert c50["state"] == [OK, DEAD, OK, EXPLODING] and c50["zero_frac"][1] == 0.95
    assert hm["states"][EXPLODING] == "exploding" and hm["thresholds"]["explode_norm"] == 100.0
    json.dumps(hm, allow_nan=False)


def test_buckets_keep_the_worst_cell_and_average_the_healthy_ones() -> None:
    rows = [row(s, [1.0, 10.0 if s != 150 else 1e4, 0.01, 1.0]) for s in range(0, 1000, 50)]
    rows[7] = row(350, [1.0, 10.0, 1e-6, 1.0])
    hm = build(rows, points=5)
    assert len(hm["columns"]) == 5 and hm["bucket"] == 4
    first = hm["columns"][0]
    assert (first["first"], first["last"], first["n"]) == (0, 150, 4)
    assert first["norm"][1] == 1e4 and first["state"][1] == EXPLODING  # one spike among four survives
    assert first["norm"][0] == pytest.approx(1.0) and first["state"][0] == OK
    assert hm["columns"][1]["norm"][2] == 1e-6 and hm["columns"][1]["state"][2] == VANISHING
    assert [c["state"][1] for c in hm["columns"][1:]] == [OK] * 4


def test_layers_missing_from_a_recording_are_empty_cells() -> None:
    hm = build(
        [row(1, [1.0, 1.0], layers=("layers.0", "lm_head")), row(2, [1.0, 1.0, 1.0], layers=LAYERS[1:])]
    )
    assert hm["layers"] == ["layers.0", "lm_head", "layers.1"]
    assert hm["columns"][0]["norm"][2] is None and hm["columns"][0]["state"][2] is None
    assert build([])["columns"] == [] and build([])["layers"] == []


def _run_with_gradflow(runs: Path) -> RunDir:
    run = RunDir(runs / "r1").create()
    with JsonlWriter(run.telemetry(0)) as w:
        for s in range(1, 121):
            extra = {}
            if s == 1 or s % 50 == 0:
                extra = {
                    "gradflow": {
                        "layers": list(LAYERS),
                        "norm": [0.5, 1.0, 1e-5 if s == 100 else 0.1, "inf"],
                        "zero_frac": [0.98, 0.0, 0.0, 0.0],
                        "hist": [[1]] * 4,
                        "bins": [0.0, 1.0],
                    }
                }
            w.write(StepRecord(step=s, ts=float(s), loss=1.0, extra=extra))
    return run


def test_api_serves_the_heat_map_and_live_increments(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _run_with_gradflow(runs)
    index = RunsIndex(runs, cache_dir=tmp_path / "cache")
    try:
        entry = index.get("r1")
        assert entry is not None
        entry.refresh()  # no supervisor: the dashboard indexes the JSONL itself
        hm = api.gradflow(entry)
        assert [c["first"] for c in hm["columns"]] == [1, 50, 100]
        assert (
            hm["columns"][2]["state"] == [OK, OK, VANISHING, EXPLODING]
            and hm["columns"][0]["norm"][3] == "inf"
        )
        assert hm["version"] >= max(r.version for r in entry.store().gradflow())
        assert [c["first"] for c in api.gradflow(entry, lo=40, hi=100)["columns"]] == [50, 100]
        assert len(api.gradflow(entry, points=1)["columns"]) == 1
        json.dumps(hm, allow_nan=False)
        # The live stream sends only what is new since a version, one column per recording.
        v50 = next(r.version for r in entry.store().gradflow() if r.step == 50)
        live = api.gradflow_since(entry, v50)
        assert live is not None and [c["first"] for c in live["columns"]] == [100] and live["bucket"] == 1
        assert api.gradflow_since(entry, live["since"]) is None
    finally:
        index.close()


def test_a_run_with_its_own_layer_limits_is_marked_and_labelled_by_them(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = _run_with_gradflow(runs)
    # The supervisor writes the resolved config beside the telemetry; only detect: matters here.
    run.config.write_text(
        "run:\n  name: r1\ndetect:\n  grad:\n    layer_vanish_norm: 0.2\n    layer_explode_norm: 1.0e+6\n"
        "    layer_dead_zero_frac: 0.99\n",
        encoding="utf-8",
    )
    index = RunsIndex(runs, cache_dir=tmp_path / "cache")
    try:
        entry = index.get("r1")
        assert entry is not None
        entry.refresh()
        hm = api.gradflow(entry)
        assert hm["thresholds"] == {"vanish_norm": 0.2, "explode_norm": 1e6, "zero_frac": 0.99}
        # 0.1 is below this run's vanish limit; embeddings at 98% zeros are under its dead share.
        assert hm["columns"][0]["state"] == [OK, OK, VANISHING, EXPLODING]
        live = api.gradflow_since(entry, 0)
        assert live is not None and live["thresholds"] == hm["thresholds"]
        run.config.write_text("detect: {grad: {layer_vanish_norm: -1}}\n", encoding="utf-8")
        assert api.gradflow(entry)["thresholds"]["vanish_norm"] == 1e-3  # unreadable: the defaults
    finally:
        index.close()


def test_states_are_named_in_code_order() -> None:
    assert [heatmap.STATES[k] for k in (OK, VANISHING, DEAD, EXPLODING)] == [
        "ok",
        "vanishing",
        "dead",
        "exploding",
    ]

"""The real-log development set: every labelled anomaly caught where it is, nothing on healthy runs.

These logs are a development set, not the judge: the detectors hold no rule for
any file. Skipped with a reason when the folder is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from steadytune.detect import detect
from steadytune.detect.scoring import Alarm, read_labels, score_file
from steadytune.importers import load

_DEFAULT = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "real-logs"
ROOT = Path(os.environ.get("STEADYTUNE_REAL_LOGS") or _DEFAULT)
pytestmark = pytest.mark.skipif(
    not (ROOT / "LABELS.tsv").is_file(), reason=f"real logs not found at {ROOT} (set STEADYTUNE_REAL_LOGS)"
)
LABELS = read_labels(ROOT / "LABELS.tsv") if (ROOT / "LABELS.tsv").is_file() else {}


@pytest.mark.parametrize("name", sorted(n for n, rows in LABELS.items() if rows[0].cls != "ambiguous"))
def test_labelled_log(name: str) -> None:
    series = load(ROOT / name)
    anomalies = detect(series.records, series.system)
    alarms = [Alarm(a.kind, a.severity, a.start_step, a.end_step) for a in anomalies]
    score = score_file(LABELS[name], [r.step for r in series.records], alarms)
    found = [(a.kind, a.severity, a.start_step) for a in anomalies]
    assert score.caught == score.positives, f"missed a labelled anomaly; found {found}"
    assert score.false_alarms == 0, f"false alarms: {found}"


def test_fp16_skips_with_a_finite_loss_are_warnings_not_rollbacks() -> None:
    for name, rows in LABELS.items():
        if rows[0].group != "nan":
            continue
        series = load(ROOT / name)
        if any(r.loss is not None and r.loss != r.loss for r in series.records):
            continue
        severities = {a.severity for a in detect(series.records) if a.kind == "nonfinite_grad"}
        assert severities == {"warning"}, name

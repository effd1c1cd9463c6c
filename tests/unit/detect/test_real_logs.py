"""The real-log development set: recall at least the leave-one-out figure, no alarm on a healthy run.

These 32 logs are a development set, not the judge: other real logs will judge the
detectors. So the test does not demand a perfect score on the files the rules were
developed on. It demands what ``benchmarks/detection.py`` measured honestly, with
every tuned threshold chosen without the file it is scored on (leave-one-file-out):
the defaults catch at least that share of the labelled anomalies, and raise nothing
on a file labelled healthy. The files are vendored (tests/realdata.py), so this runs
on a clean clone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from steadytune.detect import detect
from steadytune.detect.offline import replay
from steadytune.detect.scoring import Alarm, read_labels, score_file
from steadytune.importers import load
from tests.realdata import labels_path, materialize

# The leave-one-file-out recall that `python benchmarks/detection.py --real-only` printed
# for the current rules (its "leave-one-out" line). Raise it when the detectors improve.
LOO_RECALL = 0.9  # 19/21

LABELS = read_labels(labels_path())
HEALTHY = sorted(n for n, rows in LABELS.items() if rows[0].cls == "negative")
POSITIVE = sorted(n for n, rows in LABELS.items() if rows[0].cls == "positive")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return materialize(tmp_path_factory.mktemp("real-logs"))


def _alarms(path: Path) -> tuple[list[int], list[Alarm], list[tuple[str, str, int]]]:
    series = load(path)
    run = replay(series.records, series.system)
    anomalies = run.anomalies
    alarms = [
        Alarm(a.kind, a.severity, a.start_step, a.end_step, firings=fired)
        for a, fired in zip(anomalies, run.firings, strict=True)
    ]
    return [r.step for r in series.records], alarms, [(a.kind, a.severity, a.start_step) for a in anomalies]


def test_the_set_has_healthy_and_anomalous_runs() -> None:
    assert len(HEALTHY) >= 10 and len(POSITIVE) >= 10


@pytest.mark.parametrize("name", HEALTHY)
def test_no_alarm_on_a_healthy_run(root: Path, name: str) -> None:
    steps, alarms, found = _alarms(root / name)
    score = score_file(LABELS[name], steps, alarms)
    assert score.false_alarms == 0, f"false alarms on a healthy run: {found}"


def test_recall_is_at_least_the_leave_one_out_figure(root: Path) -> None:
    caught = positives = 0
    missed: list[str] = []
    for name in POSITIVE:
        steps, alarms, found = _alarms(root / name)
        score = score_file(LABELS[name], steps, alarms)
        caught, positives = caught + score.caught, positives + score.positives
        if score.caught < score.positives:
            missed.append(f"{name}: {score.caught}/{score.positives} (found {found})")
    assert positives >= 15
    assert caught / positives >= LOO_RECALL, f"recall {caught}/{positives}; missed:\n" + "\n".join(missed)


def test_fp16_skips_with_a_finite_loss_are_warnings_not_rollbacks(root: Path) -> None:
    checked = 0
    for name, rows in LABELS.items():
        if rows[0].group != "nan":
            continue
        series = load(root / name)
        if any(r.loss is not None and r.loss != r.loss for r in series.records):
            continue
        severities = {a.severity for a in detect(series.records) if a.kind == "nonfinite_grad"}
        assert severities == {"warning"}, name
        checked += 1
    assert checked >= 1


def test_the_vendored_copy_is_the_shared_set() -> None:
    """The vendored files are byte for byte the shared ones, where the shared folder is present."""
    import gzip

    from tests.realdata import SHARED, VENDORED

    if not (SHARED / "LABELS.tsv").is_file():
        pytest.skip(f"no shared real-log folder at {SHARED}")
    for src in sorted(SHARED.iterdir()):
        vendored = VENDORED / (src.name if src.suffix in (".tsv", ".md") else src.name + ".gz")
        assert vendored.is_file(), f"{src.name} is not vendored under {VENDORED}"
        data = vendored.read_bytes()
        assert (data if vendored.suffix != ".gz" else gzip.decompress(data)) == src.read_bytes(), src.name

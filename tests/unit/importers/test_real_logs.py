"""Every file of the real-log development set parses, in the format it is (vendored: tests/realdata.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from steadytune.importers import UnreadableLog, load
from tests.realdata import labels_path, materialize


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return materialize(tmp_path_factory.mktemp("real-logs"))


FORMAT_BY_SUFFIX = {
    "trainer_state.json": "hf_trainer_state",
    "trainer_log.jsonl": "llamafactory_trainer_log",
    "golden.json": "megatron_golden_values",
    "snippets.log": "megatron_text",
    "main.log": "llmc_log",
}


def _labelled() -> list[str]:
    lines = labels_path().read_text().splitlines()[1:]
    return sorted({line.split("\t")[0] for line in lines if line.strip()})


@pytest.mark.parametrize("name", _labelled())
def test_every_labelled_log_parses_with_losses(root: Path, name: str) -> None:
    s = load(root / name)
    expected = next(fmt for suffix, fmt in FORMAT_BY_SUFFIX.items() if name.endswith(suffix))
    assert s.format == expected
    assert s.steps >= 6 and "loss" in s.metrics
    steps = [r.step for r in s.records]
    assert steps == sorted(set(steps))


def test_a_model_config_is_not_mistaken_for_a_log(root: Path) -> None:
    configs = list(root.glob("*.yaml"))
    if not configs:
        pytest.skip("no yaml in the real-log folder")
    with pytest.raises(UnreadableLog):
        load(configs[0])


def test_golden_value_placeholders_are_not_nan_losses(root: Path) -> None:
    for golden in root.glob("*golden.json"):
        assert all(r.loss is None or r.loss == r.loss for r in load(golden).records), golden.name

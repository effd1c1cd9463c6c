"""Every file of the real-log development set parses, in the format it is (skipped when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from steadytune.importers import UnreadableLog, load

_DEFAULT = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "real-logs"
ROOT = Path(os.environ.get("STEADYTUNE_REAL_LOGS") or _DEFAULT)
pytestmark = pytest.mark.skipif(
    not (ROOT / "LABELS.tsv").is_file(), reason=f"real logs not found at {ROOT} (set STEADYTUNE_REAL_LOGS)"
)

FORMAT_BY_SUFFIX = {
    "trainer_state.json": "hf_trainer_state",
    "trainer_log.jsonl": "llamafactory_trainer_log",
    "golden.json": "megatron_golden_values",
    "snippets.log": "megatron_text",
}


def _labelled() -> list[str]:
    if not (ROOT / "LABELS.tsv").is_file():
        return []
    return [line.split("\t")[0] for line in (ROOT / "LABELS.tsv").read_text().splitlines()[1:] if line.strip()]


@pytest.mark.parametrize("name", _labelled())
def test_every_labelled_log_parses_with_losses(name: str) -> None:
    s = load(ROOT / name)
    expected = next(fmt for suffix, fmt in FORMAT_BY_SUFFIX.items() if name.endswith(suffix))
    assert s.format == expected
    assert s.steps >= 6 and "loss" in s.metrics
    steps = [r.step for r in s.records]
    assert steps == sorted(set(steps))


def test_a_model_config_is_not_mistaken_for_a_log() -> None:
    configs = list(ROOT.glob("*.yaml"))
    if not configs:
        pytest.skip("no yaml in the real-log folder")
    with pytest.raises(UnreadableLog):
        load(configs[0])


def test_golden_value_placeholders_are_not_nan_losses() -> None:
    for golden in ROOT.glob("*golden.json"):
        assert all(r.loss is None or r.loss == r.loss for r in load(golden).records), golden.name

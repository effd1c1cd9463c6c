"""The quant: section: defaults, and broken values named with key, value and fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from steadytune.config import ConfigError, load_config


def _config(tmp_path: Path, quant: dict | None = None) -> Path:
    (tmp_path / "train.jsonl").write_text('{"text": "hello"}\n')
    doc = {"model": {"name_or_path": "m"}, "data": {"train_file": str(tmp_path / "train.jsonl")}}
    if quant is not None:
        doc["quant"] = quant
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_defaults(tmp_path: Path) -> None:
    q = load_config(_config(tmp_path), check_paths=False).quant
    assert q.candidates == ["int8", "nf4", "fp8"]
    assert (q.max_ppl_change, q.max_mean_kl, q.max_p99_kl, q.min_top1) == (0.02, 0.05, 0.5, 0.9)


@pytest.mark.parametrize(
    ("quant", "key", "words"),
    [
        ({"max_ppl_change": -0.1}, "quant.max_ppl_change", "relative perplexity rise"),
        ({"min_top1": 1.5}, "quant.min_top1", "share of tokens"),
        ({"candidates": ["int9"]}, "quant.candidates", "int8, nf4, fp4"),
        ({"candidates": ["nf4", "nf4"]}, "quant.candidates", "more than once"),
        ({"max_positions": 3}, "quant.max_positions", "eval tokens"),
        ({"max_kl": 1}, "quant.max_kl", "did you mean"),
    ],
)
def test_broken_values_name_key_value_and_fix(tmp_path: Path, quant: dict, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_config(tmp_path, quant), check_paths=False)
    text = err.value.render()
    assert key in text and words in text, text

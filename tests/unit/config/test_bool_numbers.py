"""``max_steps: yes`` is True to YAML 1.1: a field declared as a number refuses a boolean and names
itself, instead of training one step and blaming ``save_steps``."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from steadytune.cli.main import main
from steadytune.config.detect import DetectConfig
from steadytune.config.schema import ModelConfig, TrainConfig

EXAMPLE = Path(__file__).parents[3] / "examples" / "full.yaml"


def _with_max_steps(tmp_path: Path, value: str) -> Path:
    lines = EXAMPLE.read_text().splitlines()
    out = [f"  max_steps: {value}" if line.strip().startswith("max_steps:") else line for line in lines]
    assert out != lines
    path = tmp_path / "cfg.yaml"
    path.write_text("\n".join(out) + "\n")
    return path


@pytest.mark.parametrize("word", ["yes", "on", "true", "no"])
def test_validate_names_max_steps_the_value_and_the_fix_and_only_it(
    tmp_path: Path, word: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(_with_max_steps(tmp_path, word))]) == 2
    said = capsys.readouterr()
    out = said.out + said.err
    assert "train.max_steps" in out and "boolean" in out and "Fix:" in out
    assert "save_steps" not in out  # not blamed for what max_steps did


def test_every_section_refuses_a_bool_where_it_wants_a_number() -> None:
    with pytest.raises(ValidationError, match="boolean"):
        TrainConfig.model_validate({"save_steps": True})
    with pytest.raises(ValidationError, match="boolean"):
        DetectConfig.model_validate({"loss": {"spike_z": True}})


def test_a_boolean_field_still_takes_one_and_a_number_field_a_number() -> None:
    model = ModelConfig.model_validate({"name_or_path": "m", "trust_remote_code": True})
    assert model.trust_remote_code is True
    assert TrainConfig.model_validate({"max_steps": 7}).max_steps == 7

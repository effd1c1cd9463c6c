"""``steadytune estimate``: exit codes, the exact JSON contract, text, no torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from steadytune.cli.main import main
from tests.unit.estimate.conftest import MODELS

MODEL = str(MODELS / "llama-3.1-8b")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["estimate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_is_exactly_the_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "--model", MODEL, "--method", "lora", "--device-memory", "80GiB", "--format", "json"
    )
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"peak_bytes", "breakdown", "fits", "max_micro_batch"}
    assert isinstance(data["peak_bytes"], int)
    assert all(isinstance(k, str) and isinstance(v, int) for k, v in data["breakdown"].items())
    assert sum(data["breakdown"].values()) == data["peak_bytes"]
    assert data["fits"] is True
    assert isinstance(data["max_micro_batch"], int) and data["max_micro_batch"] >= 1


def test_json_without_device_memory_has_nulls(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--model", MODEL, "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["fits"] is None and data["max_micro_batch"] is None


def test_does_not_fit_exits_1_and_says_what_to_change(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--model", MODEL, "--method", "full", "--device-memory", "80GiB")
    assert code == 1
    assert "DOES NOT FIT" in out and "what to change" in out
    for label in (
        "weights",
        "gradients",
        "optimizer states",
        "activations",
        "CUDA context",
        "allocator margin",
    ):
        assert label in out


def test_text_explains_limits(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "--model", MODEL, "--method", "qlora", "--gradient-checkpointing", "--device-memory", "24GB"
    )
    assert code == 0
    assert "FITS" in out and "largest micro-batch" in out and "longest seq" in out


def test_config_file_and_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model:\n  name_or_path: {MODEL}\nmethod: lora\nlora:\n  r: 16\n  target_modules: all-linear\n"
        "data:\n  max_seq_length: 1024\ntrain:\n  per_device_train_batch_size: 2\n  bf16: true\n"
    )
    code, out, _ = run(capsys, str(config), "--format", "json")
    from_file = json.loads(out)["peak_bytes"]
    code2, out2, _ = run(capsys, str(config), "--batch", "4", "--format", "json")
    assert code == code2 == 0
    assert json.loads(out2)["peak_bytes"] > from_file


def test_config_model_path_with_tilde_is_the_home_folder(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    model = home / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "vocab_size": 512,
                "max_position_embeddings": 128,
            }
        )
    )
    monkeypatch.setenv("HOME", str(home))
    config = tmp_path / "run.yaml"
    config.write_text("model:\n  name_or_path: ~/models/tiny\nmethod: lora\n")
    code, out, err = run(capsys, str(config))
    assert code == 0, err
    # A model under a million parameters is counted in millions, not as "0.00 B".
    assert re.search(r"llama: 0\.\d\d M params", out), out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ((), "no model"),
        (("--model", "/nonexistent/model"), "no config.json"),
        (("--model", MODEL, "--device-memory", "lots"), "--device-memory"),
        (("--model", MODEL, "--batch", "0"), "batch=0"),
    ],
)
def test_usage_errors_exit_2_with_the_fix(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], fragment: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert fragment in err


def test_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    out, _ = capsys.readouterr()
    assert "example:" in out and "steadytune estimate --model" in out


def test_estimate_never_imports_torch() -> None:
    code = (
        "import sys\n"
        "from steadytune.cli.main import main\n"
        f"rc = main(['estimate', '--model', {MODEL!r}, '--device-memory', '80GiB', '--format', 'json'])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "sys.exit(rc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr

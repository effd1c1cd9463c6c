"""``steadytune check`` on the demo model: the demo config is a go, every planted defect is reported.

The go runs as the user runs it (a subprocess, ``--format json``), with the demo model's real tokenizer
and the tokenized-data cache. The defect checks call the same entry point in this process
(``steadytune.cli.main.main``): a ``check`` subprocess spends most of its life importing torch and
transformers, which this process imports once.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from steadytune.cli.demo import demo_config
from steadytune.cli.main import main

from .runs import STEADYTUNE

pytestmark = pytest.mark.slow

WORDS = ["apple", "river", "stone", "cloud"]


def check(config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [STEADYTUNE, "check", str(config), *args, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=config.parent,
    )
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def check_here(config: Path) -> tuple[int, dict[str, Any]]:
    """``check`` as :func:`check` runs it, through the CLI's own ``main`` in this process (the variables it
    sets for itself are put back, as a subprocess's would end with it)."""
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check", str(config), "--format", "json"])
    assert out.getvalue().strip(), err.getvalue()
    return code, json.loads(out.getvalue())


def named(report: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in report["checks"] if c["name"] == name]
    assert len(found) == 1, f"{name}: {found}"
    return found[0]


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def _warned_about_the_demo(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The warnings on the demo's own config, data and memory (the host's system and versions are the
    machine's, not the demo's)."""
    return [
        (c["name"], c["reason"])
        for c in report["checks"]
        if c["status"] in ("warn", "fail") and c["family"] not in ("system", "versions")
    ]


def test_demo_config_is_a_go_and_warms_the_shared_data_cache(tmp_path: Path, demo_assets: Path) -> None:
    config = write_yaml(tmp_path / "demo.yaml", demo_config(demo_assets, str(tmp_path / "runs"), 200, "full"))
    code, report = check(config)
    assert code == 0 and report["verdict"] == "go", [c for c in report["checks"] if c["status"] == "fail"]
    # The demo's learning rate is in range for its width. Left: its repeated samples and its weight
    # decay of 0 (making the rows distinct or adding decay moves the demo's numerics, on which the
    # README's alert walk-through and the tool scenarios are tuned).
    assert [name for name, _ in _warned_about_the_demo(report)] == ["weight_decay", "duplicates"]
    assert report["device"] in ("cpu", "cuda")
    assert named(report, "tokens")["data"]["longest"] <= 128
    rec = report["recommendation"]
    assert rec["per_device_train_batch_size"] * rec["gradient_accumulation_steps"] == 8
    # The scan tokenized through the run's cache: the entry is there for the run, with its meta.json.
    proc = subprocess.run(
        [STEADYTUNE, "cache", "ls", "--format", "json"], capture_output=True, text=True, timeout=60
    )
    sources = [e["source"] for e in json.loads(proc.stdout)["entries"]]
    assert str((demo_assets / "train.jsonl").resolve()) in sources


def test_the_demo_lora_config_draws_no_warning_on_its_config(tmp_path: Path, demo_assets: Path) -> None:
    config = write_yaml(tmp_path / "demo.yaml", demo_config(demo_assets, str(tmp_path / "runs"), 200, "lora"))
    code, report = check(config)
    assert code == 0 and [name for name, _ in _warned_about_the_demo(report)] == ["duplicates"]


def broken_rows() -> tuple[list[bytes], dict[str, int]]:
    """A dataset with one of each defect, and the line of each."""

    def row(instruction: str, output: str, inp: str = "") -> bytes:
        return json.dumps({"instruction": instruction, "input": inp, "output": output}).encode()

    lines = {
        "good": row("Repeat the words.", "apple river", "apple river"),
        "empty": row("", ""),
        "whitespace": row("   ", "  ", "\t"),
        "over_long": row("Repeat the words.", " ".join(WORDS * 100)),  # ~500 tokens > 300
        "all_masked": row(" ".join(WORDS * 100), "ok"),  # the prompt alone fills max_seq_length
        "duplicate": row("Repeat the words.", "apple river", "apple river"),
        "utf8": b'{"instruction": "Name the caf\xe9.", "input": "", "output": "Paris"}',  # Latin-1, not UTF-8
        "good2": row("Add the numbers.", "5", "2 + 3"),
    }
    return list(lines.values()), {name: i + 1 for i, name in enumerate(lines)}


@pytest.fixture(scope="module")
def broken(
    tmp_path_factory: pytest.TempPathFactory, demo_assets: Path
) -> tuple[int, dict[str, Any], dict, Path]:
    tmp = tmp_path_factory.mktemp("broken")
    raw, at = broken_rows()
    data = tmp / "broken.jsonl"
    data.write_bytes(b"\n".join(raw) + b"\n")
    config = write_yaml(
        tmp / "broken.yaml",
        {
            "model": {"name_or_path": str(demo_assets / "model")},
            "method": "lora",
            "lora": {"r": 512, "lora_alpha": 1},
            "data": {
                "train_file": str(data),
                "format": "instruction",
                "max_seq_length": 300,
            },  # model: 256 positions
            "train": {
                "learning_rate": 1.0,
                "per_device_train_batch_size": 2,
                "max_steps": 10,
                "save_steps": 50,
            },
            "run": {"runs_dir": str(tmp / "runs")},
        },
    )
    code, report = check_here(config)
    return code, report, at, data


def test_broken_dataset_every_defect_is_reported(broken) -> None:
    code, report, at, _ = broken
    assert code == 1 and report["verdict"] == "no-go"
    utf8 = named(report, "utf8")
    assert utf8["status"] == "fail" and utf8["data"]["lines"] == [at["utf8"]]
    assert f"line {at['utf8']}" in utf8["reason"]
    assert named(report, "empty")["data"]["lines"] == [at["empty"]]
    assert named(report, "whitespace")["data"]["lines"] == [at["whitespace"]]
    assert named(report, "duplicates")["data"]["lines"] == [at["duplicate"]]
    assert f"{at['duplicate']} = {at['good']}" in named(report, "duplicates")["reason"]
    over = named(report, "over_long")
    assert over["status"] == "warn" and at["over_long"] in over["data"]["lines"]
    assert "truncated" in over["reason"] and over["fix"]
    masked = named(report, "all_masked")
    assert masked["status"] == "warn" and masked["data"]["lines"] == [at["all_masked"]]
    assert named(report, "label_vocab")["status"] == "ok"
    # The defects are found in one pass even though the loader itself would stop at the bad byte.
    assert "tokenized directly" in named(report, "tokens")["reason"]


def test_the_all_masked_sample_is_really_all_masked(broken, demo_assets: Path) -> None:
    from transformers import AutoTokenizer

    from steadytune.data.encode import IGNORE_INDEX, DataSpec, encode_row

    _, _, at, data = broken
    tok = AutoTokenizer.from_pretrained(demo_assets / "model")
    row = json.loads(data.read_bytes().split(b"\n")[at["all_masked"] - 1])
    enc = encode_row(tok, row, "instruction", DataSpec(str(data), "instruction", max_seq_length=300))
    assert len(enc["labels"]) == 300 and set(enc["labels"]) == {IGNORE_INDEX}


def test_broken_config_every_lint_is_reported(broken) -> None:
    _, report, _, _ = broken
    lr = named(report, "learning_rate")
    assert lr["status"] == "warn" and "learning_rate=1 " in lr["reason"]
    alpha = named(report, "lora_alpha")
    assert alpha["status"] == "warn" and "1/512" in alpha["reason"]
    assert named(report, "lora_r")["status"] == "warn"
    seq = named(report, "max_seq_length")
    assert seq["status"] == "warn" and "max_position_embeddings=256" in seq["reason"]
    save = named(report, "config_train_save_steps")
    assert save["status"] == "fail" and "max_steps=10" in save["reason"]
    assert report["recommendation"]["max_seq_length"] == 256


def small_vocab_model(tmp: Path, assets: Path, vocab: int | None = None, chat_template: bool = True) -> Path:
    """The demo tokenizer next to a config.json that differs (no weights: check needs none)."""
    model = tmp / f"model-{vocab}-{chat_template}"
    model.mkdir()
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        *(("chat_template.jinja",) if chat_template else ()),
    ):
        shutil.copy(assets / "model" / name, model / name)
    config = json.loads((assets / "model" / "config.json").read_text())
    if vocab is not None:
        config["vocab_size"] = vocab
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_token_ids_beyond_the_vocabulary_and_a_missing_chat_template(
    tmp_path: Path, demo_assets: Path
) -> None:
    base = {
        "method": "full",
        "train": {"learning_rate": 1e-5, "max_steps": 20, "save_steps": 10},
        "run": {"runs_dir": str(tmp_path / "runs")},
    }
    small = small_vocab_model(tmp_path, demo_assets, vocab=300)
    config = write_yaml(
        tmp_path / "vocab.yaml",
        {
            **base,
            "model": {"name_or_path": str(small)},
            "data": {"train_file": str(demo_assets / "eval.jsonl")},
        },
    )
    code, report = check_here(config)
    found = named(report, "label_vocab")
    assert code == 1 and found["status"] == "fail" and "vocab_size 300" in found["reason"]
    assert found["data"]["max_id"] >= 300

    chats = tmp_path / "chats.jsonl"
    chats.write_text(
        json.dumps(
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
        )
        + "\n"
    )
    plain = small_vocab_model(tmp_path, demo_assets, chat_template=False)
    config = write_yaml(
        tmp_path / "chat.yaml",
        {**base, "model": {"name_or_path": str(plain)}, "data": {"train_file": str(chats)}},
    )
    code, report = check_here(config)
    template = named(report, "chat_template")
    assert code == 1 and template["status"] == "fail" and "no chat template" in template["reason"]


def test_run_does_not_start_on_a_no_go(tmp_path: Path, demo_assets: Path) -> None:
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(
        (demo_assets / "train.jsonl").read_bytes()[:2000].rsplit(b"\n", 1)[0]
        + b"\n"
        + b'{"instruction": "caf\xe9", "input": "", "output": "x"}\n'
    )
    config = write_yaml(
        tmp_path / "run.yaml",
        {
            "model": {"name_or_path": str(demo_assets / "model")},
            "method": "full",
            "data": {"train_file": str(data)},
            "train": {"max_steps": 4, "save_steps": 2, "learning_rate": 1e-4},
            "run": {"runs_dir": str(tmp_path / "runs")},
        },
    )
    proc = subprocess.run(
        [STEADYTUNE, "run", str(config), "--run-id", "stopped", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "data/utf8" in proc.stdout and "not started" in proc.stdout
    assert not (tmp_path / "runs" / "stopped").exists()

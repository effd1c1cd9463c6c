"""Repro bundles are attachments from strangers: checking one must not run code shipped in it.

A hostile bundle here carries a "model" folder with ``auto_map`` and a
``tokenization_x.py`` / ``configuration_x.py`` that write a marker file when
imported, and a ``config.yaml`` that sets ``trust_remote_code: true`` and points
``model.name_or_path`` at that folder (a relative path resolves against the
bundle's own folder). ``repro --check`` must refuse, name ``--trust-remote-code``,
and the marker must never appear.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, STEADYTUNE

CODE = """import pathlib
pathlib.Path({marker!r}).write_text("imported {name}")
from transformers import PretrainedConfig, PreTrainedTokenizer


class XConfig(PretrainedConfig):
    model_type = "evilx"


class XTokenizer(PreTrainedTokenizer):
    pass
"""


def evil_model(evil: Path, marker: Path) -> Path:
    """A model folder whose ``auto_map`` names Python files of its own that write ``marker``."""
    evil.mkdir(parents=True)
    for name in ("tokenization_x", "configuration_x"):
        (evil / f"{name}.py").write_text(CODE.format(marker=str(marker), name=name))
    auto_map = {"AutoConfig": "configuration_x.XConfig", "AutoTokenizer": ["tokenization_x.XTokenizer", None]}
    (evil / "config.json").write_text(json.dumps({"model_type": "evilx", "auto_map": auto_map}))
    (evil / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "XTokenizer", "auto_map": {"AutoTokenizer": auto_map["AutoTokenizer"]}}
        )
    )
    return evil


def hostile_bundle(tmp: Path, marker: Path, trust: bool = True, model: str = "evil") -> Path:
    top = tmp / "build" / "repro-x-step1"
    evil_model(top / "evil", marker)
    (top / "data").mkdir()
    (top / "data" / "samples.jsonl").write_text(json.dumps({"st_sample_id": 0, "row": {"text": "hi"}}) + "\n")
    cfg = {
        "model": {"name_or_path": model, "trust_remote_code": trust},
        "method": "full",
        "data": {"train_file": "data/samples.jsonl", "format": "text"},
        "train": {"max_steps": 2, "per_device_train_batch_size": 1},
    }
    (top / "config.yaml").write_text(yaml.safe_dump(cfg))
    step = {"step": 1, "attempt": 0, "rank": 0, "ranks": 1, "indices": [0], "hashes": [""], "loss": 1.0,
            "grad_norm": 1.0, "skipped": False, "lr": 1e-4, "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 1, "max_seq_length": 32, "lr_scale": 1.0}  # fmt: skip
    meta = {
        "version": 1,
        "run_id": "x",
        "step": 1,
        "start_step": 0,
        "max_steps": 2,
        "checkpoint": None,
        "data": {"path": "data/samples.jsonl", "included": True},
        "events_at_step": [],
        "replay": [step],
    }
    (top / "bundle.json").write_text(json.dumps(meta))
    out = tmp / "hostile.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(top, top.name)
    return out


def check(bundle: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp / "hf"),
        "HF_MODULES_CACHE": str(tmp / "mods"),
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    }  # this checkout
    return subprocess.run(
        [STEADYTUNE, "repro", "--check", str(bundle), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp,
    )


def test_check_refuses_trust_remote_code_from_a_bundle_and_runs_none_of_its_code(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    proc = check(hostile_bundle(tmp_path, marker), tmp_path)
    assert not marker.exists(), "repro --check imported Python code shipped inside the bundle"
    assert proc.returncode != 0
    assert "--trust-remote-code" in proc.stderr and "trust_remote_code" in proc.stderr, proc.stderr


@pytest.mark.parametrize("flag", [[], ["--trust-remote-code"]])
def test_a_model_path_inside_the_bundle_is_refused_even_when_trusted(tmp_path: Path, flag: list[str]) -> None:
    marker = tmp_path / "PWNED"
    proc = check(hostile_bundle(tmp_path, marker, trust=bool(flag)), tmp_path, *flag)
    assert not marker.exists(), "repro --check loaded a model folder shipped inside the bundle"
    assert proc.returncode != 0 and "inside the bundle" in proc.stderr, proc.stderr


def test_guard_keeps_remote_code_off_unless_asked_and_accepts_the_included_checkpoint(tmp_path: Path) -> None:
    from steadytune.forensics.bundlerun import prepare
    from steadytune.forensics.unpack import UnsafeBundle

    hostile_bundle(tmp_path, tmp_path / "PWNED", trust=True, model=str(tmp_path / "elsewhere"))
    top = tmp_path / "build" / "repro-x-step1"
    with pytest.raises(UnsafeBundle, match="--trust-remote-code"):
        prepare(top)
    _, cfg = prepare(top, trust_remote_code=True)  # asked for, on a model outside the bundle
    assert cfg.model.trust_remote_code is True

    hostile_bundle(tmp_path / "b", tmp_path / "PWNED", trust=False, model="checkpoint/checkpoint-0")
    top = tmp_path / "b" / "build" / "repro-x-step1"
    (top / "checkpoint" / "checkpoint-0").mkdir(parents=True)
    meta = json.loads((top / "bundle.json").read_text())
    meta["checkpoint"] = {"name": "checkpoint-0", "step": 0, "path": "/nowhere", "manifest_sha256": "0"}
    (top / "bundle.json").write_text(json.dumps(meta))
    _, cfg = prepare(top, trust_remote_code=True)  # the included checkpoint may be loaded from the bundle
    assert cfg.model.trust_remote_code is False  # the config did not ask for it
    with pytest.raises(UnsafeBundle, match="inside the bundle"):
        prepare(top, model=top / "evil")  # --model pointing into the bundle is no way around it
    meta["checkpoint"]["name"] = "../evil"
    (top / "bundle.json").write_text(json.dumps(meta))
    with pytest.raises(UnsafeBundle, match="not a folder name"):
        prepare(top)


def test_inspect_batch_runs_no_code_that_came_with_a_run_folder(tmp_path: Path, make_run) -> None:
    """A run folder is as foreign as a bundle once copied: its ``config.yaml`` asking for
    ``trust_remote_code`` must not make ``inspect-batch`` import its model folder's Python."""
    marker = tmp_path / "PWNED"
    run = make_run([{"instruction": "the cat sat", "input": "", "output": "on a mat"}], [(1, [0])])
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"] = {"name_or_path": str(evil_model(tmp_path / "evil", marker)), "trust_remote_code": True}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_MODULES_CACHE": str(tmp_path / "mods"),
    }
    proc = subprocess.run(
        [STEADYTUNE, "inspect-batch", str(run), "--step", "1"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert not marker.exists(), "inspect-batch imported Python code that came with the run folder"
    assert "--trust-remote-code" in proc.stdout + proc.stderr, proc.stdout + proc.stderr

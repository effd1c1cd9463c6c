"""Fixtures for forensics unit tests: a tiny word-level tokenizer and a fake run directory, torch-free."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from steadytune.records import BatchFingerprint, StepRecord, to_json

WORDS = "the cat sat on a mat dog ran far away red blue green ### Instruction: Input: Response: ok".split()


@pytest.fixture()
def tiny_model(tmp_path: Path) -> Path:
    """A model folder with only what inspect-batch reads: tokenizer.json, tokenizer_config.json,
    config.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<pad>", "<s>", "</s>", "<unk>"])
    folder = tmp_path / "model"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"})
    )
    (folder / "config.json").write_text(json.dumps({"vocab_size": len(vocab), "model_type": "llama"}))
    return folder


@pytest.fixture()
def make_run(tmp_path: Path, tiny_model: Path) -> Callable[..., Path]:
    """``make_run(rows, steps)``: a run directory whose dataset is ``rows`` and whose telemetry has
    one step record per ``(step, indices)``; hashes are computed as the guard records them."""

    def build(
        rows: list[dict[str, Any]],
        steps: list[tuple[int, list[int]]],
        max_seq_length: int = 32,
        hash_rows: list[dict[str, Any]] | None = None,
        losses: dict[int, float] | None = None,
    ) -> Path:
        from steadytune.data.encode import DataSpec, encode_row, sample_hash
        from steadytune.forensics.tokenizer import LightTokenizer

        data = tmp_path / "train.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        run = tmp_path / "runs" / "r1"
        (run / "telemetry").mkdir(parents=True)
        cfg = {
            "model": {"name_or_path": str(tiny_model)},
            "method": "full",
            "data": {"train_file": str(data), "format": "instruction", "max_seq_length": max_seq_length},
            "train": {"per_device_train_batch_size": 2},
        }
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))
        tok = LightTokenizer(tiny_model)
        spec = DataSpec(str(data), "instruction", max_seq_length=max_seq_length)
        source = hash_rows or rows
        with open(run / "telemetry" / "rank-0.jsonl", "w") as f:
            for step, ids in steps:
                hashes = tuple(
                    f"{sample_hash(encode_row(tok, source[i], 'instruction', spec)['input_ids']):015x}"
                    for i in ids
                )
                loss = (losses or {}).get(step, 1.0)
                f.write(
                    to_json(
                        StepRecord(
                            step=step,
                            ts=float(step),
                            loss=loss,
                            grad_norm=1.0,
                            batch=BatchFingerprint(tuple(ids), hashes),
                        )
                    )
                    + "\n"
                )
        return run

    return build

"""One registry of log formats: every reader declares its own; analyze and supervise read through it."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import steadytune.importers as importers
from steadytune.importers import BY_NAME, FORMATS, LINE_FORMATS, REGISTRY, LogFormat, detect_format, load
from steadytune.supervise import logparse


def test_every_reader_module_declares_what_the_registry_holds() -> None:
    declared = []
    for info in pkgutil.iter_modules(importers.__path__):
        module = importlib.import_module(f"steadytune.importers.{info.name}")
        declared += [v.name for v in vars(module).values() if isinstance(v, LogFormat)]
        if hasattr(module, "FORMAT") and info.name != "format":
            assert module.FORMAT in BY_NAME, f"{info.name}.FORMAT is declared nowhere as a LogFormat"
    assert sorted(declared) == sorted(FORMATS) and len(set(FORMATS)) == len(FORMATS)


def test_every_format_is_recognised_somewhere_and_the_catch_all_is_tried_last() -> None:
    for f in REGISTRY:
        sniffs = (f.sniff_path, f.dir_file, f.sniff_row, f.sniff_json_head, f.sniff_document, f.sniff_text)
        assert any(s is not None for s in sniffs), f.name
        assert (f.read_json is None) or (f.sniff_row or f.sniff_document), f.name
    text = [f.name for f in REGISTRY if f.sniff_text is not None]
    assert text[-1] == "text_log" and "csv" in text and not BY_NAME["csv"].text_tail
    # A LLaMA-Factory output folder holds trainer_state.json too: the Trainer's own file is read.
    dirs = [f.dir_file for f in REGISTRY if f.dir_file]
    assert dirs == ["trainer_state.json", "trainer_log.jsonl"]


def test_supervise_reads_a_commands_stdout_through_the_registry() -> None:
    assert [f.name for f in LINE_FORMATS] == ["dict_log"]
    line = "{'loss': 2.5, 'grad_norm': 1.25, 'learning_rate': 2e-05, 'epoch': 0.5}"
    assert logparse.parse_log_line(line) == importers.parse_line(line) == BY_NAME["dict_log"].parse_line(line)
    assert logparse.parse_log_line(line) == {
        "loss": 2.5,
        "grad_norm": 1.25,
        "learning_rate": 2e-05,
        "epoch": 0.5,
    }


def test_a_folder_stands_for_the_log_inside_it(tmp_path: Path) -> None:
    rows = [f'{{"current_steps": {i}, "total_steps": 30, "loss": {3.0 - 0.05 * i}}}' for i in range(1, 31)]
    (tmp_path / "trainer_log.jsonl").write_text("\n".join(rows) + "\n")
    assert detect_format(tmp_path) == "llamafactory_trainer_log"
    assert [r.step for r in load(tmp_path).records] == list(range(1, 31))

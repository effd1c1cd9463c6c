"""What `supervise` reads from a tool it does not run: log dicts, progress bars, checkpoints."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from steadytune.checkpoint.external import check_external_checkpoint, safetensors_problem
from steadytune.supervise.logparse import is_summary, last_exception, parse_log_line, train_bar
from steadytune.telemetry.stream import iter_records

# `trl sft` (TRL 1.16, transformers 5.24) with stdout and stderr in one pipe: the bar rewrites
# its line with carriage returns, and the log dict lands at the end of it.
TRL_LINE = (
    "  5%|\u258c         | 1/20 [00:00<00:02,  6.96it/s]\r 20%|\u2588\u2588        | 4/20 "
    "[00:00<00:01, 12.03it/s]\r                                              \r{'loss': '6.215', "
    "'grad_norm': '6.335', 'learning_rate': '1.6e-05', 'entropy': '6.213', 'mean_token_accuracy': "
    "'0', 'num_tokens': '580', 'epoch': '0.05'}\n"
)
TRL_SUMMARY = (
    "\r                                               \r{'train_runtime': '1.288', "
    "'train_samples_per_second': '62.12', 'train_steps_per_second': '15.53', 'train_loss': '6.15', "
    "'epoch': '0.2'}\n"
)


def test_a_log_dict_after_a_progress_bar_is_read() -> None:
    values = parse_log_line(TRL_LINE)
    assert values is not None
    assert values["loss"] == 6.215 and values["grad_norm"] == 6.335 and values["learning_rate"] == 1.6e-05
    assert values["num_tokens"] == 580 and values["epoch"] == 0.05


def test_escape_codes_and_plain_lines() -> None:
    assert parse_log_line("\x1b[32m{'loss': 2.5, 'epoch': 1.0}\x1b[0m\n") == {"loss": 2.5, "epoch": 1.0}
    assert parse_log_line("Saving model checkpoint to out/checkpoint-10") is None
    assert parse_log_line(" 45%|████▌     | 9/20 [00:01<00:01,  8.1it/s]") is None


def test_the_closing_summary_is_not_a_step() -> None:
    values = parse_log_line(TRL_SUMMARY)
    assert values is not None and is_summary(values)
    assert not is_summary(parse_log_line(TRL_LINE) or {})
    assert not is_summary({"eval_loss": 1.2, "epoch": 1.0})


def test_the_trainer_bar_gives_the_total_steps_and_other_bars_do_not() -> None:
    assert train_bar(TRL_LINE) == (4, 20)
    assert (
        train_bar("Tokenizing train dataset: 100%|██████████| 400/400 [00:00<00:00, 4128.33 examples/s]")
        is None
    )
    assert train_bar("Loading weights: 100%|██████████| 21/21 [00:00<00:00, 13577.98it/s]") is None
    assert train_bar("plain text") is None


def _safetensors(path: Path, tensors: dict[str, int]) -> None:
    """A real safetensors file: an 8-byte header length, the JSON header, then the tensor bytes."""
    header, offset = {}, 0
    for name, n in tensors.items():
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [offset, offset + 4 * n]}
        offset += 4 * n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def _checkpoint(root: Path, step: int, weights: str = "model.safetensors") -> Path:
    ck = root / f"checkpoint-{step}"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    _safetensors(ck / weights, {"a": 1000, "b": 24})
    return ck


def test_a_whole_safetensors_file_passes(tmp_path: Path) -> None:
    ck = _checkpoint(tmp_path, 10)
    assert safetensors_problem(ck / "model.safetensors") is None
    assert check_external_checkpoint(ck) == (True, "")


@pytest.mark.parametrize("cut", [1, 100, 4000])
def test_a_file_cut_short_with_its_header_intact_is_incomplete(tmp_path: Path, cut: int) -> None:
    ck = _checkpoint(tmp_path, 10)
    w = ck / "model.safetensors"
    data = w.read_bytes()
    w.write_bytes(data[:-cut])
    ok, why = check_external_checkpoint(ck)
    assert not ok and "cut short" in why and "model.safetensors" in why


def test_a_shard_the_index_names_must_exist_and_be_whole(tmp_path: Path) -> None:
    ck = tmp_path / "checkpoint-20"
    ck.mkdir()
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 20}))
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    (ck / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": names[0], "b": names[1]}})
    )
    _safetensors(ck / names[0], {"a": 10})
    ok, why = check_external_checkpoint(ck)
    assert not ok and names[1] in why
    _safetensors(ck / names[1], {"b": 10})
    assert check_external_checkpoint(ck) == (True, "")
    (ck / names[1]).write_bytes((ck / names[1]).read_bytes()[:-8])
    ok, why = check_external_checkpoint(ck)
    assert not ok and names[1] in why


def test_the_cause_is_found_behind_a_launcher_wrapper() -> None:
    tail = (
        "Traceback (most recent call last):\n"
        '  File "sft.py", line 10, in <module>\n'
        "safetensors_rust.SafetensorError: Error while deserializing header: incomplete metadata\n"
        "Traceback (most recent call last):\n"
        '  File "launch.py", line 999, in simple_launcher\n'
        "subprocess.CalledProcessError: Command '['python', 'sft.py']' returned non-zero exit status 1.\n"
    )
    assert last_exception(tail) == (
        "SafetensorError",
        "Error while deserializing header: incomplete metadata",
    )
    assert last_exception("ValueError: bad value for learning_rate\n") == (
        "ValueError",
        "bad value for learning_rate",
    )
    assert last_exception("all good\n") is None


def test_the_logging_interval_is_read_from_the_command(tmp_path: Path) -> None:
    from steadytune.supervise.logparse import logging_steps_from

    assert logging_steps_from(["trl", "sft", "--logging_steps", "5"]) == 5
    assert logging_steps_from(["python", "train.py", "--logging-steps=20"]) == 20
    cfg = tmp_path / "sft.yaml"
    cfg.write_text("model_name_or_path: m\nlogging_steps: 7\nsave_steps: 50\n")
    assert logging_steps_from(["llamafactory-cli", "train", str(cfg)]) == 7
    assert logging_steps_from(["llamafactory-cli", "train", str(cfg), "logging_steps=3"]) == 3
    assert logging_steps_from(["python", "train.py"]) is None


def _adapter(tmp_path: Path):
    from steadytune.rundir import RunDir
    from steadytune.supervise.log_adapter import LogAdapter
    from steadytune.telemetry.stream import JsonlWriter

    run = RunDir(tmp_path / "run").create()
    writer = JsonlWriter(run.telemetry(0))
    return (
        run,
        writer,
        LogAdapter(
            writer, ["python", "train.py", "--logging_steps", "10"], tmp_path / "out", clock=lambda: 0.0
        ),
    )


def _resumable(tmp_path: Path) -> Path:
    ck = tmp_path / "out" / "checkpoint-40"
    ck.mkdir(parents=True)
    history = [
        {"step": s, "loss": 2.0 - s / 100, "epoch": s / 20, "learning_rate": 1e-4} for s in (10, 20, 30, 40)
    ]
    (ck / "trainer_state.json").write_text(
        json.dumps({"global_step": 40, "epoch": 2.0, "log_history": history})
    )
    return ck


def test_after_a_resume_the_log_lines_count_on_from_the_checkpoints_step(tmp_path: Path) -> None:
    run, writer, adapter = _adapter(tmp_path)
    adapter.begin(1, _resumable(tmp_path))
    adapter.on_stdout("{'loss': '1.58', 'epoch': '2.5'}\n")
    writer.close()
    recs = [r for r in iter_records(run.telemetry(0)) if getattr(r, "loss", None) is not None]
    assert [(r.step, r.attempt) for r in recs] == [(50, 1)]  # counted on by its logging interval


@pytest.mark.parametrize(
    "first, mismatch",
    [
        ({"loss": 1.58, "epoch": 2.5}, []),  # continues: epoch and loss follow the checkpoint
        ({"loss": 6.9, "epoch": 0.5}, ["epoch", "loss"]),  # started over: epoch 0.5, the untrained loss
        ({"loss": 4.2, "epoch": 2.5}, ["loss"]),  # the right place, but the curve jumped
        ({"loss": 1.58, "epoch": 2.5, "step": 40}, ["step"]),  # the step did not move on
    ],
)
def test_the_first_record_after_a_resume_must_continue_the_checkpoint(
    tmp_path: Path, first: dict, mismatch: list[str]
) -> None:
    from steadytune.records import StepRecord
    from steadytune.supervise.restarts import resume_expectation, resume_problems

    expect = resume_expectation(_resumable(tmp_path))
    assert expect == {"step": 40.0, "epoch": 2.0, "loss": 1.6, "lr": 1e-4}
    rec = StepRecord(step=first.get("step", 50), ts=0.0, loss=first["loss"], epoch=first["epoch"])
    problems = resume_problems(rec, expect, steps_are_real=True)
    assert [p.split()[0] for p in problems] == mismatch
    # Counted steps (from log lines, not the trainer's counter) say nothing about where it resumed.
    assert not any(p.startswith("step") for p in resume_problems(rec, expect, steps_are_real=False))


# `trl dpo` (TRL 1.16) prints its preference metrics in the same dict as the loss.
DPO_LINE = (
    " 10%|\u2588         | 2/20 [00:00<00:01, 12.6it/s]\r{'loss': '0.6931', 'grad_norm': '1.836', "
    "'learning_rate': '1e-04', 'entropy': '6.212', 'num_tokens': '412', 'logits/chosen': '0.01202', "
    "'rewards/chosen': '0', 'rewards/rejected': '0', 'rewards/accuracies': '0', 'rewards/margins': '0', "
    "'logps/chosen': '-43.9', 'logps/rejected': '-54.4', 'epoch': '0.1667'}\n"
)


def test_what_a_record_has_no_field_for_rides_in_its_extra(tmp_path: Path) -> None:
    run, writer, adapter = _adapter(tmp_path)
    adapter.on_stdout(DPO_LINE)
    adapter.on_stdout("{'eval_loss': '0.65', 'eval_rewards/margins': '0.2', 'epoch': '0.2'}\n")
    writer.close()
    train, evaluation = [r for r in iter_records(run.telemetry(0)) if hasattr(r, "loss")]
    assert (train.loss, train.grad_norm, train.lr, train.epoch) == (0.6931, 1.836, 1e-4, 0.1667)
    assert train.extra["rewards/margins"] == 0.0 and train.extra["logps/chosen"] == -43.9
    # The values the record's own fields took are not repeated beside them.
    assert not {"loss", "grad_norm", "learning_rate", "epoch", "num_tokens"} & set(train.extra)
    assert evaluation.eval_loss == 0.65
    assert evaluation.extra == {"eval": True, "eval_rewards/margins": 0.2}


# What `swift sft` (ms-swift 4.6) prints with --logging_steps 2: it logs step 1 as well, so counting its
# dicts by the logging interval would date them 2, 4, 6 instead of 1, 2, 4.
SWIFT_LINES = [
    "Train:  10%|\u2588         | 1/10 [00:00<00:06,  1.35it/s]     {'loss': '6.31', 'grad_norm': '2.476', "
    "'learning_rate': '9.755e-05', 'token_acc': '0', 'epoch': '0.04396', 'global_step/max_steps': '1/10', "
    "'elapsed_time': '1s', 'remaining_time': '7s', 'train_speed(s/it)': '0.7475'}\n",
    "Train:  20%|\u2588\u2588        | 2/10 [00:01<00:04,  1.91it/s]     {'loss': '6.275', 'grad_norm': "
    "'2.349', 'learning_rate': '9.045e-05', 'token_acc': '0', 'epoch': '0.08791', 'global_step/max_steps': "
    "'2/10', 'elapsed_time': '1s', 'remaining_time': '4s', 'train_speed(s/it)': '0.5576'}\n",
    "Train:  40%|\u2588\u2588\u2588\u2588      | 4/10 [00:01<00:02,  2.44it/s]     {'loss': '6.219', "
    "'grad_norm': '2.686', 'learning_rate': '6.545e-05', 'token_acc': '0.00813', 'epoch': '0.1758', "
    "'global_step/max_steps': '4/10', 'elapsed_time': '2s', 'remaining_time': '3s', 'train_speed(s/it)': "
    "'0.4541'}\n",
]


def test_a_dict_that_names_its_step_is_recorded_at_it_with_the_runs_length(tmp_path: Path) -> None:
    from steadytune.records import Event

    run, writer, adapter = _adapter(tmp_path)  # the command says --logging_steps 10: the dicts say otherwise
    for line in SWIFT_LINES:
        adapter.on_stdout(line)
    writer.close()
    records = list(iter_records(run.telemetry(0)))
    steps = [r for r in records if getattr(r, "loss", None) is not None]
    assert [(r.step, r.loss, r.grad_norm) for r in steps] == [
        (1, 6.31, 2.476),
        (2, 6.275, 2.349),
        (4, 6.219, 2.686),
    ]
    assert not {"global_step", "global_step/max_steps"} & set(steps[0].extra)
    begin = [r for r in records if isinstance(r, Event) and r.name == "train_begin"]
    assert [e.data["max_steps"] for e in begin] == [10]


def test_the_trainers_closing_summary_says_training_is_over(tmp_path: Path) -> None:
    from steadytune.records import Heartbeat

    run, writer, adapter = _adapter(tmp_path)
    adapter.on_stdout("{'loss': '2.1', 'grad_norm': '1.5', 'learning_rate': '1e-4', 'epoch': '0.1'}\n")
    adapter.on_stdout("{'train_runtime': '12.5', 'train_samples_per_second': '40', 'train_loss': '2.2'}\n")
    adapter.on_stdout("Saving the merged model...\n")
    writer.close()
    beats = [r.phase for r in iter_records(run.telemetry(0)) if isinstance(r, Heartbeat)]
    assert beats[-1] == "finish"  # at once, not a second later: the next line may be a minute away
    adapter.begin(1, None)  # a new attempt trains again
    assert adapter._finished is False


def test_the_failure_lines_are_cut_to_a_readable_width_keeping_each_lines_end() -> None:
    # One long line (a progress bar with no newline, a dumped tensor) put the tail's 8 kB on the console.
    from steadytune.supervise.logparse import LINE_CHARS, last_lines

    long = "Q" * 8000 + " ValueError: the end"
    lines = last_lines(f"first\n{long}\nshort\n")
    assert lines[0] == "first" and lines[2] == "short"
    assert len(lines[1]) < LINE_CHARS + 40 and lines[1].endswith("ValueError: the end")
    assert lines[1].startswith(f"[line cut to its last {LINE_CHARS} characters] …")

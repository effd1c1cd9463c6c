"""Each importer on a small file of its format, with the hazards real logs have."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from steadytune.importers import UnreadableLog, detect_format, load
from steadytune.records import StepRecord, SystemSample
from steadytune.rundir import RunDir
from steadytune.telemetry.stream import JsonlWriter


def _losses(path: Path) -> list[tuple[int, float | None]]:
    return [(r.step, r.loss) for r in load(path).records]


def test_hf_trainer_state_keeps_nan_grad_merges_eval_and_skips_the_summary(tmp_path: Path) -> None:
    p = tmp_path / "trainer_state.json"
    p.write_text(
        '{"global_step": 3, "log_history": ['
        '{"epoch": 0.1, "grad_norm": NaN, "learning_rate": 1e-4, "loss": 2.5, "step": 1},'
        '{"epoch": 0.2, "grad_norm": 1.5, "learning_rate": 1e-4, "loss": 2.1, "step": 2},'
        '{"epoch": 0.2, "eval_loss": 2.3, "eval_runtime": 1.0, "step": 2},'
        '{"epoch": 0.3, "step": 3, "train_loss": 2.3, "train_runtime": 10.0, "total_flos": 1.0}]}'
    )
    s = load(p)
    assert (s.format, s.steps) == ("hf_trainer_state", 2)
    first, second = s.records
    assert math.isnan(first.grad_norm or 0.0) and first.lr == 1e-4 and first.epoch == 0.1
    assert (second.loss, second.eval_loss, second.extra.get("eval_runtime")) == (2.1, 2.3, 1.0)
    assert {"loss", "grad_norm", "lr", "eval_loss", "epoch"} <= set(s.metrics)


@pytest.mark.parametrize("name", ["trainer_state.json", "history.json"])
def test_steps_that_carry_the_run_time_so_far_are_steps(tmp_path: Path, name: str) -> None:
    # The Trainer with include_num_input_tokens_seen (and TRL) puts train_runtime and its tokens per second
    # beside every logged loss; only the closing entry, with no loss, is the run's summary.
    entries = [
        {"epoch": s / 100, "grad_norm": 0.07, "learning_rate": 1e-4, "loss": 1.7 - s / 100,
         "num_input_tokens_seen": 7000 * s, "step": s, "train_runtime": 3.1 * s,
         "train_tokens_per_second": 2400.0}
        for s in range(5, 55, 5)
    ]  # fmt: skip
    entries.insert(4, {"epoch": 0.2, "eval_loss": 1.6, "eval_runtime": 2.0, "step": 20})
    entries.append({"step": 50, "total_flos": 1e15, "train_loss": 1.5, "train_runtime": 160.0})
    doc = {"global_step": 50, "log_history": entries} if name == "trainer_state.json" else entries
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    s = load(p)
    assert [r.step for r in s.records] == list(range(5, 55, 5))
    assert [r.loss for r in s.records] == pytest.approx([1.7 - k / 100 for k in range(5, 55, 5)])
    assert [r.step for r in s.records if r.eval_loss is not None] == [20]


def test_a_checkpoint_directory_stands_for_its_trainer_state(tmp_path: Path) -> None:
    (tmp_path / "trainer_state.json").write_text('{"log_history": [{"loss": 1.0, "step": 5}]}')
    assert detect_format(tmp_path) == "hf_trainer_state" and _losses(tmp_path) == [(5, 1.0)]


def test_llamafactory_log_skips_torn_lines_and_reads_elapsed_time(tmp_path: Path) -> None:
    p = tmp_path / "trainer_log.jsonl"
    p.write_text(
        '{"current_steps": 10, "total_steps": 30, "loss": 2.2, "lr": 1e-5, "epoch": 0.1, '
        '"percentage": 33.3, "elapsed_time": "0:00:32", "remaining_time": "0:01:04"}\n'
        "{not json\n"
        '{"current_steps": 20, "total_steps": 30, "loss": 2.0, "lr": 2e-5, "epoch": 0.2, '
        '"elapsed_time": "1 day, 0:01:03"}\n'
        '{"current_steps": 20, "total_steps": 30, "eval_loss": 2.4, "epoch": 0.2}\n'
        '{"current_steps": 30, "loss'
    )
    s = load(p)
    assert s.format == "llamafactory_trainer_log"
    assert [(r.step, r.loss, r.eval_loss, r.ts) for r in s.records] == [
        (10, 2.2, None, 32.0),
        (20, 2.0, 2.4, 86463.0),
    ]
    assert "percentage" not in s.metrics


def test_megatron_text_joins_wrapped_lines_and_keeps_real_nan(tmp_path: Path) -> None:
    p = tmp_path / "train.log"
    p.write_text(
        "noise before\n"
        " iteration      100/    1000 | consumed samples: 800 | elapsed time per iteration (ms): 250.0 |"
        " learning rate: 1.0E-04 | global batch size: 8 | lm loss: 3.5E+00 | loss scale: 1.0 |"
        " grad norm: 2.5 | number of skipped iterations: 0 | number of nan iterations: 0 |\n"
        "time (ms)\n"
        " iteration      110/    1000 | consumed samples: 880 | elapsed time per iteration (ms): 251.0 | "
        "learning rate:\n"
        " 1.0E-04 | global batch size: 8 | lm loss: 3.4E+00 | loss scale: 1.0 | grad norm: 2.4 | number "
        "of skipped iteratio\n"
        "ns:   1 | number of nan iterations:   0 |\n"
        " iteration      120/    1000 | lm loss: nan | grad norm: nan |\n"
    )
    s = load(p)
    a, b, c = s.records
    assert s.format == "megatron_text"
    assert (a.step, a.loss, a.grad_norm, a.lr, a.samples, a.step_time_s) == (100, 3.5, 2.5, 1e-4, 8, 0.25)
    assert (b.step, b.loss, b.skipped) == (110, 3.4, True)
    assert c.step == 120 and math.isnan(c.loss or 0.0)


def test_megatron_golden_values_drop_the_nan_placeholders(tmp_path: Path) -> None:
    p = tmp_path / "golden.json"
    doc = {
        "lm loss": {
            "start_step": 1,
            "end_step": 15,
            "step_interval": 5,
            "values": {"1": 10.5, "5": 9.0, "10": "nan"},
        },
        "mem-allocated-bytes": {
            "start_step": 1,
            "end_step": 15,
            "step_interval": 5,
            "values": {"1": 1e9, "5": 1e9},
        },
    }
    p.write_text(json.dumps(doc, indent=4))
    s = load(p)
    assert s.format == "megatron_golden_values"
    assert _losses(p) == [(1, 10.5), (5, 9.0)]
    assert s.records[0].mem_allocated_bytes == 10**9


def test_llmc_log(tmp_path: Path) -> None:
    p = tmp_path / "main.log"
    p.write_text("s:0 tel:11.0\ns:1 trl:10.9\ns:2 trl:10.1 lr:0.0006 norm:2.5\n")
    s = load(p)
    assert s.format == "llmc_log"
    assert [(r.step, r.loss, r.eval_loss, r.grad_norm) for r in s.records] == [
        (0, None, 11.0, None),
        (1, 10.9, None, None),
        (2, 10.1, None, 2.5),
    ]


def test_wandb_csv_export_drops_run_prefix_and_bands(tmp_path: Path) -> None:
    p = tmp_path / "export.csv"
    p.write_text(
        "Step,run-7 - train/loss,run-7 - train/loss__MIN,run-7 - train/loss__MAX,run-7 - train/grad_norm\n"
        "1,2.5,2.4,2.6,1.0\n2,,,,1.1\n3,2.2,2.1,2.3,\n"
    )
    s = load(p)
    assert s.format == "csv"
    assert [(r.step, r.loss, r.grad_norm) for r in s.records] == [
        (1, 2.5, 1.0),
        (2, None, 1.1),
        (3, 2.2, None),
    ]
    assert not any("__MIN" in m for m in s.metrics)


def test_tensorboard_events_file_and_directory(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    w = EventFileWriter(str(tmp_path))
    for step in (1, 2, 3):
        values = [
            Summary.Value(tag="train/loss", simple_value=3.0 - step),
            Summary.Value(tag="train/lr", simple_value=1e-4),
        ]
        w.add_event(Event(step=step, wall_time=float(step), summary=Summary(value=values)))
    w.close()
    (events,) = tmp_path.glob("events.out.tfevents*")
    for path in (tmp_path, events):
        assert detect_format(path) == "tensorboard"
        assert _losses(path) == [(1, 2.0), (2, 1.0), (3, 0.0)]


def test_steadytune_run_directory_keeps_the_last_record_per_step_and_rank(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run").create()
    with JsonlWriter(run.telemetry(0)) as w0, JsonlWriter(run.telemetry(1)) as w1:
        for step, loss in ((1, 2.0), (2, 1.9), (2, 1.8), (3, 1.7)):  # step 2 replayed after a restart
            w0.write(StepRecord(step=step, ts=float(step), loss=loss))
            w1.write(StepRecord(step=step, ts=float(step), rank=1, loss=loss))
    with JsonlWriter(run.system) as ws:
        ws.write(SystemSample(ts=1.0, cpu_ratio=0.5))
    s = load(run.root)
    assert s.format == "steadytune_run" and s.steps == 3
    assert [(r.step, r.rank, r.loss) for r in s.records if r.rank == 0] == [
        (1, 0, 2.0),
        (2, 0, 1.8),
        (3, 0, 1.7),
    ]
    assert len(s.records) == 6 and len(s.system) == 1


def test_steadytune_run_directory_joins_an_evaluation_to_the_step_it_evaluated(tmp_path: Path) -> None:
    """An evaluation's record (extra.eval) of a step already trained adds its eval_loss to it; a later
    attempt of the step still replaces both. The fields a trainer logged (extra) are listed as metrics."""
    run = RunDir(tmp_path / "run").create()
    flow = {"layers": ["a"], "norm": [1.0]}
    with JsonlWriter(run.telemetry(0)) as w:
        w.write(StepRecord(step=1, ts=1.0, loss=2.0, extra={"reward": 0.1, "gradflow": flow}))
        w.write(StepRecord(step=2, ts=2.0, loss=1.9, extra={"reward": 0.2, "kl": 0.01}))
        w.write(StepRecord(step=2, ts=2.5, eval_loss=2.1, extra={"eval": True}))
        w.write(StepRecord(step=3, ts=3.0, loss=1.8, extra={"reward": 0.3}))
        w.write(StepRecord(step=3, ts=3.5, eval_loss=2.0, extra={"eval": True}))
        w.write(StepRecord(step=3, ts=4.0, attempt=1, loss=1.7, extra={"reward": 0.4}))
    s = load(run.root)
    assert [(r.step, r.attempt, r.loss, r.eval_loss, r.extra.get("reward")) for r in s.records] == [
        (1, 0, 2.0, None, 0.1),
        (2, 0, 1.9, 2.1, 0.2),
        (3, 1, 1.7, None, 0.4),
    ]
    assert s.metrics == ["loss", "eval_loss", "kl", "reward"]


def test_interleaved_duplicates_keep_the_last_value_per_step(tmp_path: Path) -> None:
    p = tmp_path / "log.csv"
    p.write_text("step,loss,grad_norm\n1,2.0,1.0\n2,1.9,1.0\n1,2.1,\n3,1.8,0.9\n")
    assert [(r.step, r.loss, r.grad_norm) for r in load(p).records] == [
        (1, 2.1, 1.0),
        (2, 1.9, 1.0),
        (3, 1.8, 0.9),
    ]


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("empty.json", "", "empty file"),
        ("blob.bin", b"\x00\x01\x02binary", "binary"),
        ("other.json", '{"model": "llama", "layers": 32}', "JSON, but neither"),
        ("notes.txt", "just some words\nno numbers here\n", "unrecognised format"),
        ("nostep.csv", "a,b\n1,2\n", "unrecognised format"),
        ("bad.json", '{\n  "log_history": [1, 2,\n', "invalid JSON"),
        ("trainer_state.json", '{"log_history": [{"epoch": 1}]}', "a step and loss / eval_loss"),
    ],
)
def test_unreadable_files_give_a_one_line_reason(
    tmp_path: Path, name: str, content: str | bytes, reason: str
) -> None:
    p = tmp_path / name
    p.write_bytes(content) if isinstance(content, bytes) else p.write_text(content)
    with pytest.raises(UnreadableLog) as e:
        load(p)
    assert reason in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("hole", [3000, 70_000])
def test_a_log_emptied_while_written_is_read_past_the_nuls_it_starts_with(tmp_path: Path, hole: int) -> None:
    # `: > train.log` beside `nohup python train.py > train.log &`: the writer keeps its offset,
    # so the file reads back as that many NULs, then the lines written since (the first glued on).
    p = tmp_path / "train.log"
    p.write_bytes(
        b"\x00" * hole + b"step 40 | loss 3.10 | lr 1e-4\nstep 50 | loss 3.05 | lr 1e-4\n"
        b"step 60 | loss 2.98 | lr 1e-4\nstep 70 | loss 2.91 | lr 1e-4\n"
    )
    assert _losses(p) == [(40, 3.10), (50, 3.05), (60, 2.98), (70, 2.91)]


def test_missing_path_and_log_without_loss(tmp_path: Path) -> None:
    with pytest.raises(UnreadableLog, match="no such file"):
        load(tmp_path / "nope.json")
    p = tmp_path / "trainer_state.json"
    p.write_text('{"log_history": [{"learning_rate": 0.1, "step": 1}]}')
    with pytest.raises(UnreadableLog, match="none of the metrics"):
        load(p)


@pytest.mark.parametrize(
    "layout",
    [
        lambda s, v: (
            json.dumps({"step": s, "loss": v}) if isinstance(s, int) else f'{{"step": {s}, "loss": {v}}}'
        ),
        lambda s, v: f"step {s} | loss {v}",
    ],
    ids=["jsonl", "text"],
)
def test_a_step_number_past_what_a_float_holds_is_left_out_not_a_crash(tmp_path: Path, layout) -> None:
    """A 400-digit step ended `analyze` in OverflowError (detect/trend.py turned it into a float)."""
    from steadytune.cli.analyze import analyze_path
    from steadytune.config.detect import DetectConfig

    rows = [layout(s, 2.0 - 0.01 * s) for s in range(40)] + [layout("9" * 400, 1.0), layout(2**60, 1.0)]
    path = tmp_path / "train.log"
    path.write_text("\n".join(rows) + "\n")
    steps = [r.step for r in load(path).records]
    assert steps == list(range(40))
    result = analyze_path(str(path), DetectConfig())
    assert result.error is None and result.steps == 40


@pytest.fixture()
def small_tmp(tmp_path: Path):
    """A 4 MiB tmpfs as the temporary folder (root only: mounting is what makes a disk small)."""
    import subprocess
    import tempfile

    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    saved, tempfile.tempdir = tempfile.tempdir, str(mnt)
    try:
        yield mnt
    finally:
        tempfile.tempdir = saved
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_gzip_log_larger_than_the_free_temporary_disk_is_refused_saying_so(
    tmp_path: Path, small_tmp: Path
) -> None:
    """It was unpacked up to 4 GiB whatever the disk had free: a full /tmp, and the error from
    the write, not one that says what to do."""
    import gzip

    rows = "".join(f"step {s} | loss {2.0 - s * 1e-6:.6f} | {'x' * 200}\n" for s in range(40_000))
    path = tmp_path / "train.log.gz"
    path.write_bytes(gzip.compress(rows.encode()))
    with pytest.raises(UnreadableLog, match="free") as e:
        load(path)
    assert "TMPDIR" in str(e.value)
    assert list(small_tmp.iterdir()) == []


@pytest.mark.parametrize(
    "text",
    [
        '{"a": ' + "[" * 100_000,
        '{"log_history": ' + "[" * 100_000,
        '{"step": 1, "loss": 2}\n{"loss": ' + "[" * 100_000,
    ],
    ids=["json", "trainer_state", "jsonl"],
)
def test_json_nested_too_deep_is_an_unreadable_log_not_a_recursion_error(tmp_path: Path, text: str) -> None:
    """load() let RecursionError out of its documented UnreadableLog (analyze showed it as a reader bug)."""
    path = tmp_path / "log.json"
    path.write_text(text)
    with pytest.raises(UnreadableLog, match="nested too deep"):
        load(path)


@pytest.mark.parametrize("field", ["loss", "grad_norm", "learning_rate", "eval_loss", "kl"])
def test_a_metric_past_a_floats_range_is_infinite_not_a_crash(tmp_path: Path, field: str) -> None:
    """Found by the fuzzing harness: a 400-digit value ended detection in OverflowError."""
    from steadytune.config.detect import DetectConfig
    from steadytune.detect.offline import replay

    rows = [{"step": s, "loss": 2.0 - 0.01 * s, "grad_norm": 1.0, "learning_rate": 1e-4} for s in range(30)]
    rows[20][field] = int("4" * 400)
    for path in (tmp_path / "train.jsonl", tmp_path / "trainer_state.json"):
        if path.suffix == ".json":
            path.write_text(json.dumps({"log_history": rows}))
        else:
            path.write_text("\n".join(json.dumps(r) for r in rows))
        series = load(path)
        value = next(r for r in series.records if r.step == 20)
        numbers = [v for v in (*vars(value).values(), *value.extra.values()) if isinstance(v, float)]
        assert any(math.isinf(v) for v in numbers), value  # under its own name or its alias (lr)
        replay(series.records, series.system, DetectConfig())


@pytest.mark.parametrize("epoch", ["1e999", "Infinity", str(int("4" * 400)), '"inf"'])
def test_an_infinite_epoch_is_no_epoch_not_a_crash(tmp_path: Path, epoch: str) -> None:
    """Found by make fuzz: int(epoch) in the detectors' seasonal and oscillation rules raised
    OverflowError."""
    from steadytune.config.detect import DetectConfig
    from steadytune.detect.offline import replay

    rows = [
        f'{{"step": {s}, "loss": {2.0 - 0.01 * s}, "epoch": {epoch if s == 20 else s / 10}}}'
        for s in range(40)
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(rows))
    series = load(path)
    assert next(r for r in series.records if r.step == 20).epoch is None
    replay(series.records, series.system, DetectConfig())


def test_jsonl_a_rank_met_late_still_gives_way_to_the_lower_rank(tmp_path: Path) -> None:
    rows = [
        {"step": 1, "loss": 3.0},  # no rank: rank 0's
        {"step": 2, "loss": 2.9},
        {"step": 1, "loss": 9.0, "rank": 1},  # a higher rank repeating a step: ignored
        {"step": 3, "loss": 8.0, "rank": 2},
        {"step": 3, "loss": 2.8, "rank": 0},  # a lower rank arriving later replaces it
        {"step": 2, "loss": 2.7},  # rank 0 again: the last value wins
    ]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = load(path)
    assert [(r.step, r.loss) for r in s.records] == [(1, 3.0), (2, 2.7), (3, 2.8)]


def test_jsonl_records_equal_those_built_by_their_constructor(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(
        '{"step": 2, "loss": 2.5, "grad_norm": 1.5, "learning_rate": 1e-4, "epoch": 0.5}\n'
        '{"step": 1, "loss": 2.6, "tokens": 512, "reward": 0.25}\n'
    )
    built = [
        StepRecord(step=1, ts=0.0, loss=2.6, tokens=512, extra={"reward": 0.25}),
        StepRecord(step=2, ts=0.0, loss=2.5, grad_norm=1.5, lr=1e-4, epoch=0.5),
    ]
    assert load(path).records == built  # every field compared, those left at their defaults too


@pytest.mark.parametrize("indent", (None, 1))
def test_a_trainer_state_on_one_line_longer_than_the_head_is_still_a_trainer_state(
    tmp_path: Path, indent: int | None
) -> None:
    # A script that dumps its state without indent writes one line; past the 64 KiB the sniffer reads,
    # the line is cut, and the printed dicts inside it looked like a console of them.
    history = [
        {
            "loss": 2.0 - s / 1000,
            "grad_norm": 1.0 + (s % 7) / 10,
            "learning_rate": 2e-5,
            "epoch": s / 800,
            "step": s,
        }
        for s in range(1, 801)
    ]
    p = tmp_path / "trainer_state.json"
    p.write_text(json.dumps({"global_step": 800, "log_history": history}, indent=indent))
    assert p.stat().st_size > 64 << 10
    assert detect_format(p) == "hf_trainer_state"
    s = load(p)
    assert [r.step for r in s.records] == list(range(1, 801)) and s.records[-1].loss == pytest.approx(1.2)

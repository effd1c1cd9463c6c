"""inspect_step on a real (tiny) run directory, torch-free."""

from __future__ import annotations

import json
import re

import pytest

from steadytune.forensics.inspect import fetch_rows, inspect_step
from steadytune.forensics.runview import ForensicsError
from tests.fresh import fresh_imports

ROWS = [
    {"instruction": "the cat sat", "input": "", "output": "on a mat"},
    {"instruction": "the dog ran", "input": "red", "output": "far away"},
    {
        "instruction": " ".join(["the cat sat on a mat"] * 20),
        "input": "",
        "output": "ok",
    },  # prompt > 32 tokens
    {"instruction": "blue green", "input": "", "output": ""},  # empty answer
]


def test_names_the_sample_whose_labels_were_truncated_away(make_run):
    run = make_run(ROWS, [(1, [0, 1]), (2, [2, 3])], losses={2: float("nan")})
    v = inspect_step(run, 2)
    assert v.verdict == "bad" and v.culprits == [2]
    bad = v.samples[0]
    assert [f.check for f in bad.findings][:2] == ["all_labels_masked", "truncated"]
    assert bad.recorded_hash == bad.current_hash and bad.stats.untruncated > bad.stats.tokens == 32
    assert [f.check for f in v.samples[1].findings] == ["empty_target"]
    assert "sample 2" in v.summary and v.summary.startswith("step 2: BAD")
    assert v.to_dict()["loss"] == "nan"


def test_healthy_step(make_run):
    run = make_run(ROWS, [(1, [0, 1])])
    v = inspect_step(run, 1)
    assert v.verdict == "ok" and v.culprits == [] and "nothing wrong" in v.summary


def test_text_only_when_asked(make_run):
    run = make_run(ROWS, [(1, [0, 1])])
    hidden = json.dumps(inspect_step(run, 1).to_dict())
    assert "on a mat" not in hidden and "the cat sat" not in hidden
    shown = inspect_step(run, 1, show_text=True)
    assert shown.samples[0].text["output"] == "on a mat"


def test_changed_dataset_is_caught_by_the_hash(make_run):
    trained = [dict(r) for r in ROWS]
    trained[1] = {"instruction": "the dog sat", "input": "", "output": "far away"}
    run = make_run(ROWS, [(1, [0, 1])], hash_rows=trained)  # the run saw a different row 1
    v = inspect_step(run, 1)
    assert v.culprits == [1] and v.samples[1].findings[0].check == "hash_mismatch"


def test_missing_row_and_unknown_step(make_run):
    run = make_run(ROWS, [(1, [0, 1])])
    lines = (run.parent.parent / "train.jsonl").read_text().splitlines()
    (run.parent.parent / "train.jsonl").write_text(lines[0] + "\n")  # the dataset shrank
    v = inspect_step(run, 1)
    assert v.samples[1].verdict == "missing" and v.culprits == [1]
    with pytest.raises(ForensicsError, match="step 9 is not in"):
        inspect_step(run, 9)


def test_latest_attempt_wins(make_run):
    from steadytune.records import BatchFingerprint, StepRecord, to_json

    run = make_run(ROWS, [(1, [0, 1])])
    with open(run / "telemetry" / "rank-0.jsonl", "a") as f:
        f.write(to_json(StepRecord(step=1, ts=9.0, attempt=1, batch=BatchFingerprint((2,), ("",)))) + "\n")
    v = inspect_step(run, 1)
    assert v.attempt == 1 and [s.sample_id for s in v.samples] == [2]


def test_fetch_rows_reads_only_what_it_needs(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"a": 0}\n\n{"a": 1}\n{"a": 2}\nnot json at all\n')
    rows, first = fetch_rows(p, {1, 2})
    assert rows == {1: {"a": 1}, 2: {"a": 2}} and first == {
        "a": 0
    }  # blank lines do not count, the bad tail is never read


def test_inspect_step_keeps_torch_out_of_the_process(make_run):
    """The supervisor never imports torch; inspect_step must not drag it in (a fresh interpreter)."""
    run = make_run(ROWS, [(1, [0, 1]), (2, [2, 3])])
    code = (
        "from steadytune.forensics.inspect import inspect_step\n"
        f"v = inspect_step({str(run)!r}, 2)\n"
        "assert v.verdict == 'bad', v.summary\n"
    )
    assert fresh_imports(code) == []


class HeavyImport(AssertionError):
    """The supervisor process imported a module it must not (only this failure is the expected one)."""


SUPERVISOR_INSPECTS = """
from pathlib import Path

from steadytune.config.load import load_config
from steadytune.rundir import RunDir
from steadytune.supervise.supervisor import Supervisor
from steadytune.telemetry.events import read_events

run = RunDir(Path({run!r}))
sup = Supervisor(load_config(run.config, check_paths=False), run, observers=[])
cause = sup.out.emit("anomaly", "nan_loss", "nan at step 2", severity="critical", step=2)
sup.actions.inspect_batch(2, cause)  # what the supervisor's background thread runs after a NaN or a spike
(done,) = [e for e in read_events(run.events) if e.name == "batch_inspected"]
assert done.data.get("verdict") == "bad" and done.data["anomaly_seq"] == cause.seq, done
"""


@pytest.mark.parametrize("data_format", ["jsonl", "csv"])
def test_the_supervisors_inspect_batch_stays_torch_and_datasets_free(make_run, data_format):
    """Actions.inspect_batch, the path a NaN or a spike takes in the supervisor process."""
    import csv

    import yaml

    run = make_run(ROWS, [(1, [0, 1]), (2, [2, 3])])
    if data_format == "csv":
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        path = run.parent.parent / "train.csv"
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["instruction", "input", "output"])
            w.writeheader()
            w.writerows(ROWS)
        cfg["data"]["train_file"] = str(path)
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    heavy = fresh_imports(SUPERVISOR_INSPECTS.format(run=str(run)))
    if heavy:
        raise HeavyImport(f"the supervisor's inspect-batch imported {heavy}")


def test_a_sample_holding_most_trained_tokens_is_named(make_run):
    rows = [{"instruction": "the cat", "input": "", "output": "ok"} for _ in range(3)]
    rows.append({"instruction": "the dog", "input": "", "output": " ".join(["red blue green far away"] * 4)})
    run = make_run(rows, [(1, [0, 1, 2, 3])])
    v = inspect_step(run, 1)
    assert v.culprits == [3] and [f.check for f in v.samples[3].findings] == ["dominates_loss"]
    assert "of the step's" in v.samples[3].findings[0].message


def test_a_run_recorded_without_sample_ids_says_why_and_what_would_record_them(make_run):
    """As under `supervise --inject`: each step's numbers, no batch. Neither inspect-batch nor repro may
    just say 'cannot be replayed' about a step the user never asked for."""
    from steadytune.forensics.bundle import build_bundle
    from steadytune.records import StepRecord, to_json
    from steadytune.rundir import RunDir

    run = make_run(ROWS, [])
    with open(run / "telemetry" / "rank-0.jsonl", "w") as f:
        for step in (1, 2, 3):
            f.write(to_json(StepRecord(step=step, ts=float(step), loss=9.0 if step == 3 else 1.0)) + "\n")
    with pytest.raises(
        ForensicsError, match=r"step 3 has no batch fingerprint .*supervise --inject.*steadytune run"
    ):
        inspect_step(run, 3)
    # No step has one: the step asked about is named, and no checkpoint, which could not help.
    with pytest.raises(ForensicsError) as said:
        build_bundle(RunDir(run), 3, False, False, None)
    assert re.match(
        r"step 3, like every step of this run, has no batch fingerprint .*steadytune run", str(said.value)
    )
    assert "checkpoint at" not in str(said.value)


def test_a_replay_without_a_checkpoint_before_it_is_said_to_start_from_the_run_start(make_run):
    """A step in between has no fingerprint: the replay would start where the run did, which is not a
    checkpoint at step 0 (none was saved there)."""
    from steadytune.forensics.bundle import build_bundle
    from steadytune.records import StepRecord, to_json
    from steadytune.rundir import RunDir

    run = make_run(ROWS, [(2, [0, 1]), (3, [2, 3])])
    with open(run / "telemetry" / "rank-0.jsonl", "a") as f:
        f.write(to_json(StepRecord(step=1, ts=0.5, loss=1.0)) + "\n")
    with pytest.raises(ForensicsError) as said:
        build_bundle(RunDir(run), 3, False, False, None)
    told = str(said.value)
    assert told.startswith(
        "step 1 (replaying step 3 goes through every step from the start of the run (no"
    ), told
    assert "checkpoint at 0" not in told

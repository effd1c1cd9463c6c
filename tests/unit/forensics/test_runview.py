"""Reading one step back from a long run: the latest attempt of it, every rank, without the whole run."""

from __future__ import annotations

from pathlib import Path

from steadytune.forensics.runview import StepBatch, final_steps, records_of_step, step_batch
from steadytune.records import BatchFingerprint, StepRecord
from steadytune.rundir import RunDir
from steadytune.telemetry.jsonl import CHUNK_BYTES
from steadytune.telemetry.stream import JsonlWriter
from tests.unit.telemetry.test_jsonl import peak_bytes  # tracemalloc's peak over one call


def rec(step: int, rank: int = 0, attempt: int = 0, first: int = 0, **extra: object) -> StepRecord:
    ids = tuple(range(first, first + 4))
    return StepRecord(
        step=step, ts=float(step), rank=rank, attempt=attempt, loss=1.0 + step / 1000,
        batch=BatchFingerprint(ids, tuple(f"{i:015x}" for i in ids)), extra=dict(extra),
    )  # fmt: skip


def run_of(tmp_path: Path, records: list[StepRecord]) -> RunDir:
    run = RunDir(tmp_path / "r").create()
    writers: dict[int, JsonlWriter] = {}
    for r in records:
        if r.rank not in writers:
            writers[r.rank] = JsonlWriter(run.telemetry(r.rank))
        writers[r.rank].write(r)
    for w in writers.values():
        w.close()
    return run


def test_one_step_reads_as_the_whole_run_would_give_it(tmp_path: Path) -> None:
    records = [rec(s, rank, 0, first=100 * s + 10 * rank) for s in range(1, 40) for rank in (0, 1)]
    # A rollback to step 10: attempt 1 trains 11.. again with other samples; an eval record and a
    # step whose number holds the asked one's digits (17 in 170, 117) must not be taken for it.
    records += [rec(s, rank, 1, first=5000 + 100 * s + rank) for s in range(11, 30) for rank in (0, 1)]
    records += [rec(17, 0, 1, first=9000, eval=True), rec(170, 0, 1), rec(117, 1, 1)]
    run = run_of(tmp_path, records)
    whole = final_steps(run)
    for step in (5, 17, 35, 170):
        assert final_steps(run, records_of_step(run, step))[step] == whole[step]
        assert step_batch(run, step).indices == tuple(i for r in whole[step] for i in r.batch.indices)
    assert step_batch(run, 17).attempt == 1
    assert step_batch(run, 17, attempt=0).indices == (1700, 1701, 1702, 1703, 1710, 1711, 1712, 1713)


def test_one_step_of_a_long_run_is_read_without_holding_the_run(tmp_path: Path) -> None:
    run = run_of(tmp_path, [rec(s) for s in range(1, 20_001)])  # about 5 MB of telemetry
    batch, peak = peak_bytes(lambda: step_batch(run, 10_777))
    assert isinstance(batch, StepBatch) and batch.indices == (0, 1, 2, 3) and batch.step == 10_777
    assert peak < 5 * CHUNK_BYTES  # the chunk read, the same joined to the line begun before it
    _, whole_peak = peak_bytes(lambda: final_steps(run))  # every record of the run, read whole
    assert whole_peak > 5 * peak


def test_one_step_is_found_in_a_rotated_stream_s_segments(tmp_path: Path) -> None:
    from steadytune.telemetry import segments

    run = run_of(tmp_path, [rec(s, first=10 * s) for s in range(1, 201)])
    segments.compress(segments.seal(run.telemetry(0)))  # steps 1-200 in rank-0.00001.jsonl.gz
    with JsonlWriter(run.telemetry(0)) as w:
        for s in range(201, 301):
            w.write(rec(s, first=10 * s))
    assert [p.name for p in run.telemetry_dir.iterdir() if p.name.endswith(".gz")] == [
        "rank-0.00001.jsonl.gz"
    ]
    whole = final_steps(run)
    for step in (7, 200, 250):
        assert step_batch(run, step).indices == tuple(i for r in whole[step] for i in r.batch.indices)

"""A steadytune run directory: ``telemetry/rank-*.jsonl`` step records and ``system.jsonl`` samples.

The records are the very ones the worker wrote, so nothing is translated; a
repeated step (a restart replays steps) keeps its last record per rank, and an evaluation's
record joins the record of the step it evaluated (as ``run.db`` merges them).
"""

from __future__ import annotations

from pathlib import Path

from steadytune.importers.format import LogFormat
from steadytune.importers.series import Series, UnreadableLog
from steadytune.records import StepRecord, SystemSample, replace
from steadytune.rundir import RunDir
from steadytune.telemetry.stream import iter_records

FORMAT = "steadytune_run"
_FIELDS = ("loss", "grad_norm", "lr", "epoch", "eval_loss", "step_time_s", "tokens", "mem_allocated_bytes")


def sniff_path(path: Path) -> bool:
    return path.is_dir() and bool(RunDir(path).telemetry_files())


def read(path: Path) -> Series:
    run = RunDir(path)
    files = run.telemetry_files()
    if not files:
        raise UnreadableLog("no telemetry/rank-*.jsonl in the run directory")
    last: dict[tuple[int, int], StepRecord] = {}
    for file in files:
        for rec in iter_records(file):
            if not isinstance(rec, StepRecord):
                continue
            key = (rec.step, rec.rank)
            prev = last.get(key)
            if prev is not None and rec.attempt == prev.attempt and rec.extra.get("eval"):
                # An evaluation of a step already trained adds its eval_loss; it must not erase the step.
                last[key] = replace(prev, eval_loss=rec.eval_loss)
            else:
                last[key] = rec
    if not last:
        raise UnreadableLog("the telemetry holds no step records")
    records = sorted(last.values(), key=lambda r: (r.step, r.rank))
    system = (
        [s for s in iter_records(run.system) if isinstance(s, SystemSample)] if run.system.exists() else []
    )
    metrics = [f for f in _FIELDS if any(getattr(r, f) is not None for r in records)]
    # What the trainer logged beside them (a TRL trainer's reward, kl, rewards/margins): numbers only,
    # not the guard's own nested readings (gradflow) or marks (eval, objective).
    logged = {k for r in records for k, v in r.extra.items() if type(v) in (int, float)}
    metrics += sorted(logged - set(metrics))
    return Series(str(path), FORMAT, records, system=system, metrics=metrics)


LOG_FORMAT = LogFormat(FORMAT, order=10, read=read, sniff_path=sniff_path)

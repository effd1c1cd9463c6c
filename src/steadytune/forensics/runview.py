"""Read a run directory back for forensics: steps as they finally stood, plans, config.

A step can be recorded more than once: a restart resumes from an older
checkpoint and trains the same step numbers again. Forensics always reads the
*latest attempt* of a step (that is the one whose weights survived), and for
data parallelism the union of the ranks of that attempt.

Torch-free: the supervisor may call into this module.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from steadytune.config.yamlsafe import read_yaml
from steadytune.records import Event, PlanRevision, StepRecord, from_dict, from_json
from steadytune.regularfile import read_text
from steadytune.rundir import RunDir
from steadytune.telemetry.jsonl import grep_lines, parse_line
from steadytune.telemetry.stream import iter_records


class ForensicsError(RuntimeError):
    """A forensics request that cannot be answered; the message says why and what to do."""


def step_records(run: RunDir) -> list[StepRecord]:
    """Every training step record of every rank (eval-only records left out), in file order."""
    out: list[StepRecord] = []
    for path in run.telemetry_files():
        out.extend(r for r in iter_records(path) if isinstance(r, StepRecord) and not r.extra.get("eval"))
    return out


def records_of_step(run: RunDir, step: int) -> list[StepRecord]:
    """The training records of one step (every rank, every attempt), in file order.

    As :func:`step_records` would give them, without holding the run: a line is parsed only when
    its text names the step. The supervisor asks this of a step that just spiked, in a run that may
    be a million steps long; reading every record whole cost it gigabytes and minutes of CPU.
    """
    named = re.compile(rb'"step"[ \t]*:[ \t]*%d(?![0-9.eE])' % step)
    out: list[StepRecord] = []
    for path in run.telemetry_files():
        for line in grep_lines(path, named):
            value = parse_line(line)
            if not isinstance(value, dict):
                continue
            try:
                rec = from_dict(value)
            except (ValueError, TypeError):
                continue  # as iter_records passes it over
            if isinstance(rec, StepRecord) and rec.step == step and not rec.extra.get("eval"):
                out.append(rec)
    return out


def final_steps(
    run: RunDir, records: list[StepRecord] | None = None, attempt: int | None = None
) -> dict[int, list[StepRecord]]:
    """``step -> records of its latest attempt`` (one per rank, rank order).

    With ``attempt``, history as that attempt saw it: attempts after it are ignored
    (after a rollback-and-skip, the spiking batch lives in the earlier attempt).
    """
    records = step_records(run) if records is None else records
    if attempt is not None:
        records = [r for r in records if r.attempt <= attempt]
    newest: dict[int, int] = {}
    for r in records:
        newest[r.step] = max(newest.get(r.step, r.attempt), r.attempt)
    by_step: dict[int, dict[int, StepRecord]] = {}
    for r in records:
        if r.attempt == newest[r.step]:
            by_step.setdefault(r.step, {})[r.rank] = r  # a later line of the same rank/attempt wins
    return {s: [ranks[k] for k in sorted(ranks)] for s, ranks in sorted(by_step.items())}


@dataclass(frozen=True)
class StepBatch:
    """The samples of one optimizer step, as the guard fingerprinted them."""

    step: int
    attempt: int
    ranks: tuple[int, ...]
    indices: tuple[int, ...]
    hashes: tuple[str, ...]
    loss: float | None
    grad_norm: float | None
    skipped: bool


def step_batch(
    run: RunDir, step: int, finals: dict[int, list[StepRecord]] | None = None, attempt: int | None = None
) -> StepBatch:
    """The recorded batch of ``step`` (latest attempt, or the newest up to ``attempt``; all ranks).

    Raises:
        ForensicsError: the step is not recorded or has no batch fingerprint.
    """
    finals = final_steps(run, records_of_step(run, step), attempt) if finals is None else finals
    recs = finals.get(step)
    if not recs:
        known = sorted(finals)
        span = f"steps {known[0]}-{known[-1]}" if known else "no steps at all"
        raise ForensicsError(
            f"step {step} is not in {run.telemetry_dir} (it holds {span}); pick a recorded step"
        )
    with_batch = [r for r in recs if r.batch is not None and r.batch.indices]
    if not with_batch:
        raise ForensicsError(no_fingerprint(step))
    indices: list[int] = []
    hashes: list[str] = []
    for r in with_batch:
        assert r.batch is not None
        indices.extend(r.batch.indices)
        hs = list(r.batch.hashes)
        hashes.extend(hs + [""] * (len(r.batch.indices) - len(hs)))  # hashes are optional
    primary = recs[0]
    return StepBatch(
        step=step,
        attempt=primary.attempt,
        ranks=tuple(r.rank for r in with_batch),
        indices=tuple(indices),
        hashes=tuple(hashes),
        loss=primary.loss,
        grad_norm=primary.grad_norm,
        skipped=any(r.skipped for r in recs),
    )


def plans(run: RunDir) -> list[PlanRevision]:
    if not run.plan.exists():
        return []
    out = []
    for line in read_text(run.plan).splitlines():
        if line.strip():
            try:
                rec = from_json(line)
            except ValueError:
                continue
            if isinstance(rec, PlanRevision):
                out.append(rec)
    return out


def plan_for_attempt(run: RunDir, attempt: int) -> PlanRevision:
    """The plan revision a given attempt ran under (the first revision when none matches)."""
    revs = plans(run)
    match = [p for p in revs if p.attempt == attempt]
    if match:
        return match[-1]
    return revs[0] if revs else PlanRevision(revision=0, ts=0.0, reason="start")


def load_run_config(run: RunDir) -> dict[str, Any]:
    """The resolved config of a run as a plain dict (no validation: an old run stays readable)."""
    try:
        data = read_yaml(run.config)
    except FileNotFoundError:
        raise ForensicsError(f"{run.config} is missing; is {run.root} a steadytune run directory?") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ForensicsError(f"{run.config} cannot be read: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise ForensicsError(f"{run.config} is not a mapping")
    return data


def is_bad(value: float | None) -> bool:
    return value is not None and not math.isfinite(value)


# Anomalies of the training signal: the ones a batch, a layer or a replay can explain.
SIGNAL_KINDS = frozenset(
    {
        "nan_loss",
        "nonfinite_grad",
        "loss_spike",
        "divergence",
        "loss_collapse",
        "grad_explosion",
        "grad_spike",
        "grad_vanishing",
    }
)


def anomaly_steps(run: RunDir, events: list[Event]) -> list[int]:
    """Steps the training signal went wrong at (signal anomalies, skipped updates); else any anomaly;
    else steps with a non-finite loss."""
    found = [
        e.step
        for e in events
        if e.step and ((e.kind == "anomaly" and e.name in SIGNAL_KINDS) or e.name == "skip_step")
    ]
    if not found:
        found = [e.step for e in events if e.step and e.kind == "anomaly"]
    if not found:
        found = [s for s, recs in final_steps(run).items() if any(r.skipped or is_bad(r.loss) for r in recs)]
    return sorted({int(s) for s in found if s is not None})


def no_fingerprint(step: int, why: str = "") -> str:
    """What to say of a step without a batch fingerprint, and what would have recorded one."""
    return (
        f"step {step}{why} has no batch fingerprint (the run was started without sample ids: a job under "
        "`supervise --inject` records the numbers of each step, not which samples it read); batch "
        "forensics needs the built-in runner (`steadytune run`) or guard.add_microbatch(sample_ids=...)"
    )


def resolve_run(path: str | Path) -> RunDir:
    """A run directory from a CLI argument, with a helpful error when it is not one."""
    root = Path(path)
    if not root.is_dir():
        raise ForensicsError(f"{root} is not a directory; pass a run directory such as runs/<run-id>")
    if not (root / "config.yaml").exists() and not (root / "events.jsonl").exists():
        raise ForensicsError(
            f"{root} has no config.yaml or events.jsonl; pass a run directory such as runs/<run-id>"
        )
    return RunDir(root)


def anomaly_attempt(events: list[Event], step: int) -> int | None:
    """The worker attempt that was running when something first went wrong at ``step``."""
    hits = [e for e in events if e.step == step and (e.kind == "anomaly" or e.name == "skip_step")]
    if not hits:
        return None
    current = None
    for e in events:
        if e.name == "worker_started" and e.ts <= hits[0].ts:
            current = int(e.data.get("attempt", 0))
    return current


# Sections that never change the numbers a replay computes: an older run whose detector or
# alert settings no longer validate is still replayable without them.
_NON_TRAINING = ("detect", "policy", "alerts", "dashboard")


def training_config(path: Path) -> Any:
    """A run's config as a validated ``SteadytuneConfig``, tolerating drift in the non-training sections."""
    from steadytune.config.load import ConfigError, load_config, validate_dict

    try:
        return load_config(path, check_paths=False)
    except ConfigError as exc:
        try:
            data = read_yaml(path) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            raise exc from None  # not a drift in other sections: the file itself is refused
        for key in _NON_TRAINING:
            data.pop(key, None)
        return validate_dict(data, base=Path(path).resolve().parent, source=str(path), check_paths=False)

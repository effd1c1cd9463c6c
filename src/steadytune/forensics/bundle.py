"""``repro``: pack what it takes to replay one step into a ``.tar.gz`` bundle.

A bundle holds the resolved (redacted) config and plan revisions, an
environment snapshot, the seed and RNG states, the sample ids and hashes of
every step to replay, a reference to the checkpoint to start from (with the
sha256 of its manifest), the metrics window and the events around the step,
and ``replay.py``. Raw samples go in only with ``include_data``, a copy of the
checkpoint only with ``include_checkpoint``: by default a bundle holds no
training text and stays small enough to attach to an issue. Paths are redacted
by default (``redact_paths``, see :mod:`steadytune.redact.paths`): relative
to the run directory inside it, ``~`` for the home directory, ``<abs>/<name>``
elsewhere; no user or host name. A copied checkpoint stays byte for byte (its
files are checked against their sha256).

The starting point is the newest verified checkpoint *before* the step:
``checkpoint-N`` already holds step N's update, so replaying step N needs the
weights as they were after step N-1. Steps between the checkpoint and the step
are replayed first, with the optimizer and scheduler state of the checkpoint.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from steadytune.checkpoint.manifest import (
    MANIFEST,
    Verdict,
    checkpoint_step,
    list_checkpoints,
    read_manifest,
    sha256_file,
    verify,
)
from steadytune.forensics.inspect import fetch_rows
from steadytune.forensics.runview import (
    ForensicsError,
    anomaly_attempt,
    anomaly_steps,
    final_steps,
    load_run_config,
    no_fingerprint,
    plan_for_attempt,
)
from steadytune.records import Event, StepRecord, to_dict
from steadytune.redact import redact
from steadytune.redact.paths import PathRedactor
from steadytune.regularfile import open_regular, read_text
from steadytune.rundir import RunDir
from steadytune.telemetry.envsnap import snapshot
from steadytune.telemetry.events import read_events
from steadytune.telemetry.jsonl import JsonlReader, parse_line

BUNDLE_VERSION = 1
WINDOW = 20  # steps of metrics and events kept on each side of the step
MAX_REPLAY_STEPS = 5000

REPLAY_PY = '''#!/usr/bin/env python3
"""Replay the step recorded in this bundle and say whether its anomaly reproduces.

    python replay.py [--checkpoint PATH] [--data PATH] [--model PATH] [--run RUN] [--format json]

Same as `steadytune repro --check <this bundle>`. Needs steadytune with its train extra
(pip install 'steadytune[train]'). This file is code that came with the bundle: run it
only on a bundle you made yourself; for anyone else's, use `steadytune repro --check`,
which runs nothing shipped in a bundle.
"""
import sys
from pathlib import Path

try:
    from steadytune.forensics.replaystep import main
except ImportError as exc:
    sys.exit(f"replay.py needs steadytune with the train extra ({exc}); pip install 'steadytune[train]'")

sys.exit(main([str(Path(__file__).resolve().parent), *sys.argv[1:]]))
'''


@dataclass(frozen=True)
class BundleInfo:
    path: Path
    step: int
    start_step: int
    checkpoint: str | None
    steps_to_replay: int
    bytes: int
    included_data: bool
    included_checkpoint: bool
    notes: tuple[str, ...] = ()


def _max_steps(events: list[Any]) -> int | None:
    for e in reversed(events):
        if e.name == "train_begin" and e.data.get("max_steps"):
            return int(e.data["max_steps"])
    return None


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), mode
    tar.addfile(info, io.BytesIO(data))


def _add_file(tar: tarfile.TarFile, path: Path, name: str) -> None:
    """``path``'s bytes as a regular member (a symlink is followed, never stored as a link)."""
    with open_regular(path, "rb") as f:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = os.fstat(f.fileno()).st_size, int(time.time()), 0o644
        tar.addfile(info, f)


def _jsonl(items: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(i, separators=(",", ":")) + "\n" for i in items).encode()


def _jsonl_lines(lines: list[str], redactor: PathRedactor | None) -> bytes:
    """JSONL lines as they are, or with their paths and identities redacted (then re-serialised)."""
    out = []
    for line in lines:
        if redactor is not None and line.strip():
            try:
                line = json.dumps(redactor.value(json.loads(line)), separators=(",", ":"))
            except ValueError:
                line = redactor.text(line)
        out.append(line + "\n")
    return "".join(out).encode()


_TEXT_SUFFIXES = {".json", ".txt", ".yaml", ".yml", ".jinja", ".md", ".model_card", ".csv", ".py"}


def _copied_paths_note(ckpt: Path, listed: list[str], redactor: PathRedactor) -> str | None:
    """A note when text files of a copied checkpoint name the run or home directory."""
    named = []
    for rel in listed:
        p = ckpt / rel
        if p.suffix.lower() not in _TEXT_SUFFIXES or p.stat().st_size > 16 * 1024**2:
            continue
        if redactor.names(p.read_text(encoding="utf-8", errors="replace")):
            named.append(rel)
    if not named:
        return None
    return (
        f"the copied checkpoint's {', '.join(named)} name absolute paths (the run or home directory): "
        "checkpoint files are copied unchanged, since --check verifies their sha256"
    )


def _event_lines(run: RunDir, lo: int, hi: int, ts_lo: float, ts_hi: float) -> list[str]:
    """Raw lines (hash fields intact) of events in the step window, or undated ones in its time span."""
    out = []
    for raw in JsonlReader(run.events).raw_lines(final=True):
        if not raw:
            continue
        e = parse_line(raw)
        if not isinstance(e, dict):
            continue
        step, ts = e.get("step"), e.get("ts") or 0
        if not isinstance(ts, (int, float)) or (step is not None and not isinstance(step, int)):
            continue
        if (step is not None and lo <= step <= hi) or (step is None and ts_lo <= ts <= ts_hi):
            out.append(raw.decode("utf-8", "replace"))
    return out


def _recorded_around(
    run: RunDir, finals: dict[int, list[StepRecord]], step: int, window: int
) -> tuple[list[StepRecord], list[str]]:
    """The step records within ``window`` steps of ``step``, and the raw event lines of that span."""
    lo, hi = step - window, step + window
    records = [r for s, rs in finals.items() if lo <= s <= hi for r in rs]
    ts_lo = min((r.ts for r in records), default=0.0) - 1.0
    ts_hi = max((r.ts for r in records), default=0.0) + 1.0
    return records, _event_lines(run, lo, hi, ts_lo, ts_hi)


def _start_checkpoint(run: RunDir, step: int, attempt: int | None) -> Verdict | None:
    """The newest verified checkpoint before ``step`` that ``attempt`` could have seen (a later
    attempt may have saved over a checkpoint name after a rollback)."""
    for ckpt in list_checkpoints(run.checkpoints):
        s = checkpoint_step(ckpt)
        if s is None or s > step - 1:
            continue
        saved_by = (read_manifest(ckpt) or {}).get("attempt")
        if attempt is not None and isinstance(saved_by, int) and saved_by > attempt:
            continue
        v = verify(ckpt)
        if v.ok:
            return v
    return None


def _chosen_step(
    run: RunDir, events: list[Event], step: int | None, attempt: int | None
) -> tuple[int, int | None]:
    """The step to bundle (default: the last anomaly's) and the attempt whose recording of it to replay
    (default: the one running when the step went wrong, else the latest).

    Raises:
        ForensicsError: no step was given and nothing went wrong.
    """
    if step is None:
        found = anomaly_steps(run, events)
        if not found:
            raise ForensicsError(f"nothing went wrong in {run.root} that I can see; pass --step N")
        step = found[-1]
    return step, anomaly_attempt(events, step) if attempt is None else attempt


def _replay_start(
    run: RunDir, cfg: dict[str, Any], step: int, attempt: int | None
) -> tuple[Path | None, int, str]:
    """The verified checkpoint the replay starts from (None: the base model), its step, and a note.

    Raises:
        ForensicsError: more than ``MAX_REPLAY_STEPS`` steps lie between it and ``step``.
    """
    verdict = _start_checkpoint(run, step, attempt)
    start = verdict.step if verdict is not None and verdict.step is not None else 0
    note = ""
    if verdict is None and cfg.get("method") != "full":
        note = (
            "no verified checkpoint before the step: LoRA starts from a fresh (random) adapter, "
            "comparisons may differ"
        )
    if step - start > MAX_REPLAY_STEPS:
        raise ForensicsError(
            f"the newest checkpoint before step {step} is at step {start}: {step - start} steps to "
            f"replay (limit {MAX_REPLAY_STEPS}); save checkpoints more often (train.save_steps)"
        )
    return (verdict.path if verdict is not None else None), start, note


def _checkpoint_entry(ckpt: Path, start: int, included: bool) -> dict[str, Any]:
    return {
        "name": ckpt.name,
        "step": start,
        "path": str(ckpt.resolve()),
        "manifest_sha256": sha256_file(ckpt / MANIFEST),
        "included": included,
    }


def _replay_steps(
    run: RunDir, finals: dict[int, list[StepRecord]], start: int, step: int
) -> list[dict[str, Any]]:
    """What ``replay.py`` needs of each step after the checkpoint: its batch, its plan, its numbers.

    Raises:
        ForensicsError: a step in between was not recorded, or has no batch fingerprint.
    """
    if not any(r.batch is not None and r.batch.indices for recs in finals.values() for r in recs):
        # No checkpoint would help (a supervised command's run): say so, not which step is missing.
        raise ForensicsError(no_fingerprint(step, ", like every step of this run,"))
    # No verified checkpoint of the run's own before the step: the replay starts from the base model.
    origin = (
        f"the checkpoint at {start}" if start else "the start of the run (no verified checkpoint before it)"
    )
    out: list[dict[str, Any]] = []
    for s in range(start + 1, step + 1):
        recs = finals.get(s)
        if not recs:
            raise ForensicsError(f"step {s} (between {origin} and step {step}) was not recorded")
        rank0 = recs[0]
        if rank0.batch is None or not rank0.batch.indices:
            needed = f" (replaying step {step} goes through every step from {origin})"
            raise ForensicsError(no_fingerprint(s, needed if s != step else ""))
        plan = plan_for_attempt(run, rank0.attempt)
        out.append(
            {
                "step": s,
                "attempt": rank0.attempt,
                "rank": rank0.rank,
                "ranks": len(recs),
                "indices": list(rank0.batch.indices),
                "hashes": list(rank0.batch.hashes),
                "loss": to_dict(rank0).get("loss"),
                "grad_norm": to_dict(rank0).get("grad_norm"),
                "skipped": rank0.skipped,
                "lr": rank0.lr,
                "per_device_train_batch_size": plan.per_device_train_batch_size,
                "gradient_accumulation_steps": plan.gradient_accumulation_steps,
                "max_seq_length": plan.max_seq_length,
                "lr_scale": plan.lr_scale,
            }
        )
    return out


def _add_checkpoint(
    tar: tarfile.TarFile, top: str, ckpt: Path, whole: bool, redactor: PathRedactor | None
) -> list[str]:
    """The checkpoint's RNG states, and with ``whole`` all of it; the notes to tell about the copy.

    Only what the (validated) manifest lists goes in: never a file outside the checkpoint.
    """
    listed = sorted((read_manifest(ckpt) or {}).get("files", {}))
    for rel in listed:
        if "/" not in rel and rel.startswith("rng_state") and rel.endswith(".pth"):
            _add_file(tar, ckpt / rel, f"{top}/rng/{rel}")
    if not whole:
        return []
    for rel in [*listed, MANIFEST]:
        _add_file(tar, ckpt / rel, f"{top}/checkpoint/{ckpt.name}/{rel}")
    copied = _copied_paths_note(ckpt, listed, redactor) if redactor is not None else None
    return [copied] if copied else []


@dataclass
class _Contents:
    """What one bundle holds, chosen: :meth:`write` makes the archive of it."""

    run: RunDir
    cfg: dict[str, Any]
    events: list[Event]
    step: int
    start: int
    ckpt: Path | None
    note: str
    replay: list[dict[str, Any]]
    records: list[StepRecord]  # the metrics around the step
    event_lines: list[str]  # and its events, as logged (hash fields intact)
    include_data: bool
    include_checkpoint: bool
    redactor: PathRedactor | None

    def clean(self, obj: Any) -> Any:
        return self.redactor.value(obj) if self.redactor is not None else obj

    @property
    def data_path(self) -> Any:
        return (self.cfg.get("data") or {}).get("train_file")

    def manifest(self, out: Path) -> dict[str, Any]:
        """``bundle.json``: what the replay starts from, each step to replay, where the bundle sits."""
        run, cfg, ckpt, step = self.run, self.cfg, self.ckpt, self.step
        manifest: dict[str, Any] = {
            "version": BUNDLE_VERSION,
            "run_id": run.run_id,
            "run_dir": str(run.root.resolve()),
            "step": step,
            "created_ts": time.time(),
            "method": cfg.get("method"),
            "seed": (cfg.get("train") or {}).get("seed"),
            "max_steps": _max_steps(self.events) or (cfg.get("train") or {}).get("max_steps"),
            "start_step": self.start,
            "notes": [self.note] if self.note else [],
            "checkpoint": None
            if ckpt is None
            else _checkpoint_entry(ckpt, self.start, self.include_checkpoint),
            "data": {"path": self.data_path, "included": self.include_data},
            "events_at_step": [
                to_dict(e) for e in self.events if e.step == step and e.kind in {"anomaly", "action"}
            ],
            "replay": self.replay,
        }
        if self.redactor is not None:
            manifest = self.clean(manifest)
            if ckpt is not None:
                manifest["checkpoint"]["path"] = ckpt.relative_to(run.root).as_posix()  # even via a symlink
        manifest["paths_redacted"] = self.redactor is not None
        try:  # where the bundle sits in its run, so --check finds the run again from the bundle's path
            manifest["bundle_in_run"] = out.resolve().relative_to(run.root.resolve()).as_posix()
        except ValueError:
            manifest["bundle_in_run"] = None
        return manifest

    def write(self, out: Path) -> list[str]:
        """The archive, written whole (a temporary file renamed into place); the notes on what it holds."""
        run, top, clean = self.run, f"repro-{self.run.run_id}-step{self.step}", self.clean
        out.parent.mkdir(parents=True, exist_ok=True)
        notes: list[str] = []
        tmp = Path(tempfile.mkstemp(prefix=".repro-", suffix=".tar.gz", dir=out.parent)[1])
        try:
            with tarfile.open(tmp, "w:gz") as tar:
                _add_bytes(tar, f"{top}/bundle.json", json.dumps(self.manifest(out), indent=1).encode())
                config = yaml.safe_dump(clean(redact(self.cfg)), sort_keys=False)
                _add_bytes(tar, f"{top}/config.yaml", config.encode())
                if run.plan.exists():
                    plan_lines = read_text(run.plan).splitlines()
                    _add_bytes(tar, f"{top}/plan.jsonl", _jsonl_lines(plan_lines, self.redactor))
                _add_bytes(tar, f"{top}/environment.json", json.dumps(clean(snapshot()), indent=1).encode())
                _add_bytes(tar, f"{top}/metrics.jsonl", _jsonl([clean(to_dict(r)) for r in self.records]))
                _add_bytes(tar, f"{top}/events.jsonl", _jsonl_lines(self.event_lines, self.redactor))
                _add_bytes(tar, f"{top}/replay.py", REPLAY_PY.encode(), 0o755)
                if self.ckpt is not None:
                    notes += _add_checkpoint(tar, top, self.ckpt, self.include_checkpoint, self.redactor)
                if self.include_data:
                    wanted = {i for s in self.replay for i in s["indices"]}
                    rows, _ = fetch_rows(self.data_path, wanted)
                    samples = [{"st_sample_id": i, "row": rows[i]} for i in sorted(rows)]
                    _add_bytes(tar, f"{top}/data/samples.jsonl", _jsonl(samples))
            shutil.move(str(tmp), out)
        finally:
            tmp.unlink(missing_ok=True)
        return notes


def build_bundle(
    run: RunDir,
    step: int | None = None,
    include_data: bool = False,
    include_checkpoint: bool = False,
    out: Path | None = None,
    window: int = WINDOW,
    attempt: int | None = None,
    redact_paths: bool = True,
) -> BundleInfo:
    """Write ``RUN/repro/repro-step<N>.tar.gz`` (or ``out``) for ``step`` (default: the last anomaly).

    ``attempt`` picks which recording of a retrained step to replay (default: the attempt
    running when the step went wrong, else the latest). ``redact_paths`` (default) keeps
    absolute paths, the home directory and user and host names out of the bundle.
    """
    events = read_events(run.events)
    step, attempt = _chosen_step(run, events, step, attempt)
    finals = final_steps(run, attempt=attempt)
    if step not in finals:
        raise ForensicsError(f"step {step} was not recorded in {run.telemetry_dir}; pick a recorded step")
    cfg = load_run_config(run)
    ckpt, start, note = _replay_start(run, cfg, step, attempt)
    records, event_lines = _recorded_around(run, finals, step, window)
    contents = _Contents(
        run=run,
        cfg=cfg,
        events=events,
        step=step,
        start=start,
        ckpt=ckpt,
        note=note,
        replay=_replay_steps(run, finals, start, step),
        records=records,
        event_lines=event_lines,
        include_data=include_data,
        include_checkpoint=include_checkpoint,
        redactor=PathRedactor(run.root) if redact_paths else None,
    )
    out = out or (run.repro / f"repro-step{step}.tar.gz")
    notes = contents.write(out)
    return BundleInfo(
        out,
        step,
        start,
        ckpt.name if ckpt else None,
        len(contents.replay),
        out.stat().st_size,
        include_data,
        include_checkpoint,
        tuple(notes),
    )

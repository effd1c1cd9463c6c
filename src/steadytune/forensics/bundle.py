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
    plan_for_attempt,
)
from steadytune.records import to_dict
from steadytune.redact import redact
from steadytune.redact.paths import PathRedactor
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
    with open(path, "rb") as f:
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
    redactor = PathRedactor(run.root) if redact_paths else None

    def clean(obj: Any) -> Any:
        return redactor.value(obj) if redactor is not None else obj

    events = read_events(run.events)
    if step is None:
        found = anomaly_steps(run, events)
        if not found:
            raise ForensicsError(f"nothing went wrong in {run.root} that I can see; pass --step N")
        step = found[-1]
    if attempt is None:
        attempt = anomaly_attempt(events, step)
    finals = final_steps(run, attempt=attempt)
    if step not in finals:
        raise ForensicsError(f"step {step} was not recorded in {run.telemetry_dir}; pick a recorded step")
    cfg = load_run_config(run)
    verdict = _start_checkpoint(run, step, attempt)
    start = verdict.step if verdict is not None and verdict.step is not None else 0
    if verdict is None and cfg.get("method") != "full":
        note = (
            "no verified checkpoint before the step: LoRA starts from a fresh (random) adapter, "
            "comparisons may differ"
        )
    else:
        note = ""
    if step - start > MAX_REPLAY_STEPS:
        raise ForensicsError(
            f"the newest checkpoint before step {step} is at step {start}: {step - start} steps to "
            f"replay (limit {MAX_REPLAY_STEPS}); save checkpoints more often (train.save_steps)"
        )
    replay_steps: list[dict[str, Any]] = []
    for s in range(start + 1, step + 1):
        recs = finals.get(s)
        if not recs:
            raise ForensicsError(
                f"step {s} (between the checkpoint at {start} and step {step}) was not recorded"
            )
        rank0 = recs[0]
        if rank0.batch is None or not rank0.batch.indices:
            raise ForensicsError(f"step {s} has no batch fingerprint: it cannot be replayed")
        plan = plan_for_attempt(run, rank0.attempt)
        replay_steps.append(
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
    ckpt = verdict.path if verdict is not None else None
    at_step = [to_dict(e) for e in events if e.step == step and e.kind in {"anomaly", "action"}]
    manifest: dict[str, Any] = {
        "version": BUNDLE_VERSION,
        "run_id": run.run_id,
        "run_dir": str(run.root.resolve()),
        "step": step,
        "created_ts": time.time(),
        "method": cfg.get("method"),
        "seed": (cfg.get("train") or {}).get("seed"),
        "max_steps": _max_steps(events) or (cfg.get("train") or {}).get("max_steps"),
        "start_step": start,
        "notes": [note] if note else [],
        "checkpoint": None
        if ckpt is None
        else {
            "name": ckpt.name,
            "step": start,
            "path": str(ckpt.resolve()),
            "manifest_sha256": sha256_file(ckpt / MANIFEST),
            "included": include_checkpoint,
        },
        "data": {"path": (cfg.get("data") or {}).get("train_file"), "included": include_data},
        "events_at_step": at_step,
        "replay": replay_steps,
    }
    data_path = manifest["data"]["path"]
    if redactor is not None:
        manifest = clean(manifest)
        if ckpt is not None:
            manifest["checkpoint"]["path"] = ckpt.relative_to(run.root).as_posix()  # even via a symlink
    manifest["paths_redacted"] = redactor is not None
    lo, hi = step - window, step + window
    window_recs = [r for s, rs in finals.items() if lo <= s <= hi for r in rs]
    ts_lo = min((r.ts for r in window_recs), default=0.0) - 1.0
    ts_hi = max((r.ts for r in window_recs), default=0.0) + 1.0
    top = f"repro-{run.run_id}-step{step}"
    out = out or (run.repro / f"repro-step{step}.tar.gz")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:  # where the bundle sits in its run, so --check finds the run again from the bundle's path
        manifest["bundle_in_run"] = out.resolve().relative_to(run.root.resolve()).as_posix()
    except ValueError:
        manifest["bundle_in_run"] = None
    notes: list[str] = []
    tmp = Path(tempfile.mkstemp(prefix=".repro-", suffix=".tar.gz", dir=out.parent)[1])
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            _add_bytes(tar, f"{top}/bundle.json", json.dumps(manifest, indent=1).encode())
            config = yaml.safe_dump(clean(redact(cfg)), sort_keys=False)
            _add_bytes(tar, f"{top}/config.yaml", config.encode())
            if run.plan.exists():
                plan_lines = run.plan.read_text(encoding="utf-8").splitlines()
                _add_bytes(tar, f"{top}/plan.jsonl", _jsonl_lines(plan_lines, redactor))
            _add_bytes(tar, f"{top}/environment.json", json.dumps(clean(snapshot()), indent=1).encode())
            _add_bytes(tar, f"{top}/metrics.jsonl", _jsonl([clean(to_dict(r)) for r in window_recs]))
            events_lines = _event_lines(run, lo, hi, ts_lo, ts_hi)
            _add_bytes(tar, f"{top}/events.jsonl", _jsonl_lines(events_lines, redactor))
            _add_bytes(tar, f"{top}/replay.py", REPLAY_PY.encode(), 0o755)
            if ckpt is not None:
                # Only what the (validated) manifest lists: never a file outside the checkpoint.
                listed = sorted((read_manifest(ckpt) or {}).get("files", {}))
                for rel in listed:
                    if "/" not in rel and rel.startswith("rng_state") and rel.endswith(".pth"):
                        _add_file(tar, ckpt / rel, f"{top}/rng/{rel}")
                if include_checkpoint:
                    for rel in [*listed, MANIFEST]:
                        _add_file(tar, ckpt / rel, f"{top}/checkpoint/{ckpt.name}/{rel}")
                    copied = _copied_paths_note(ckpt, listed, redactor) if redactor is not None else None
                    notes += [copied] if copied else []
            if include_data:
                wanted = {i for s in replay_steps for i in s["indices"]}
                rows, _ = fetch_rows(data_path, wanted)
                _add_bytes(
                    tar,
                    f"{top}/data/samples.jsonl",
                    _jsonl([{"st_sample_id": i, "row": rows[i]} for i in sorted(rows)]),
                )
        shutil.move(str(tmp), out)
    finally:
        tmp.unlink(missing_ok=True)
    return BundleInfo(
        out,
        step,
        start,
        ckpt.name if ckpt else None,
        len(replay_steps),
        out.stat().st_size,
        include_data,
        include_checkpoint,
        tuple(notes),
    )

"""``repro --check``: replay a bundle's step and say whether the anomaly reproduces.

Rebuilds the run's model, optimizer and scheduler the way the HF Trainer does
(the same :mod:`steadytune.train.runner` builders, the Trainer's own optimizer
factory, its own loaders of ``optimizer.pt`` / ``scheduler.pt`` / ``rng_state.pth``),
then replays each recorded step from the checkpoint to the step: the recorded
samples, split into the recorded micro-batches, loss normalised over the step's
label tokens, gradients clipped, NaN steps skipped as the guard skips them.

Verdict: a NaN/Inf step reproduces when the replay is non-finite again; a finite
anomaly (spike, collapse) reproduces when loss and grad norm match the record
within the tolerances; a healthy step reports no anomaly when it matches.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from steadytune.forensics.bundlerun import (
    bundle_rows,
    locate_run,
    prepare,
    resolve_checkpoint,
)
from steadytune.forensics.unpack import UnpackLimits, add_limit_flags, opened
from steadytune.scratch import owned_tempdir

LOSS_RTOL, LOSS_ATOL = 1e-3, 1e-4
NORM_RTOL, NORM_ATOL = 1e-2, 1e-4


@dataclass
class StepOutcome:
    step: int
    loss: float
    grad_norm: float
    recorded_loss: float | None
    recorded_grad_norm: float | None
    matches: bool


@dataclass
class ReplayResult:
    step: int
    start_step: int
    checkpoint: str | None
    verdict: str  # reproduced / not_reproduced / healthy / mismatch
    message: str
    anomaly_recorded: bool
    steps: list[StepOutcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)  # the step's loss, sample by sample

    @property
    def ok(self) -> bool:
        return self.verdict in {"reproduced", "healthy"}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["steps"] = [
            {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in s.items()}
            for s in d["steps"]
        ]
        return d


def _f(x: Any) -> float | None:
    if x is None:
        return None
    try:
        return float(x)  # "nan"/"inf" strings written by records.json_safe come back as floats
    except (TypeError, ValueError):
        return None


def close(a: float, b: float | None, rtol: float, atol: float) -> bool:
    if b is None:
        return True
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.isfinite(a) == math.isfinite(b)
    return abs(a - b) <= atol + rtol * abs(b)


def _load_model(cfg: Any, ckpt: Path | None) -> Any:
    from steadytune.train.runner import load_model

    gc = bool(cfg.train.gradient_checkpointing)
    if ckpt is None or cfg.method == "full":
        if ckpt is not None:
            cfg = cfg.model_copy(deep=True)
            cfg.model.name_or_path = str(ckpt)
        return load_model(cfg, gc)
    # LoRA/QLoRA: the base with a fresh adapter, then the checkpoint's adapter weights (as a Trainer resume
    # does).
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    model = load_model(cfg, gc)
    set_peft_model_state_dict(model, load_file(str(ckpt / "adapter_model.safetensors")))
    return model


def replay(
    folder: Path,
    checkpoint: Path | None = None,
    data: Path | None = None,
    model: Path | None = None,
    trust_remote_code: bool = False,
    run: Path | None = None,
) -> ReplayResult:
    """Replay the bundle in ``folder`` (unpacked). Imports torch and transformers, once the bundle
    passed :func:`guard_code` (``model`` replaces the config's model path; ``run`` is the run the
    bundle came from, for the paths it redacted)."""
    meta, cfg = prepare(folder, model, trust_remote_code, run, data)
    import dataclasses
    import warnings

    import torch
    from transformers.utils import logging as hf_logging

    from steadytune.forensics.tokenizer import load_hf_tokenizer
    from steadytune.telemetry.envsnap import differences, snapshot

    hf_logging.disable_progress_bar()  # the verdict is the output; loading bars are noise here
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    torch.use_deterministic_algorithms(True, warn_only=True)
    notes = list(meta.get("notes", []))
    env_path = folder / "environment.json"
    diff = differences(json.loads(env_path.read_text()), snapshot()) if env_path.exists() else []
    if diff:
        notes.append("environment differs from the run's: " + "; ".join(diff))
    ckpt = resolve_checkpoint(folder, meta, checkpoint, run)
    rows = bundle_rows(folder, meta, cfg, data)
    tok = load_hf_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
    trainer = _trainer_at_checkpoint(cfg, meta, ckpt, tok)
    args, optimizer, scheduler = trainer.args, trainer.optimizer, trainer.lr_scheduler
    assert optimizer is not None and scheduler is not None  # just created
    if ckpt is None:
        notes.append("no checkpoint before the step: replayed from the base net with a fresh optimizer")
    base_spec = _data_spec(cfg, rows)
    fmt = base_spec.format
    default_bs = (
        cfg.train.per_device_train_batch_size if isinstance(cfg.train.per_device_train_batch_size, int) else 1
    )
    outcomes: list[StepOutcome] = []
    by_sample: list[dict[str, Any]] = []
    net = trainer.model  # the Trainer's, on its device
    assert net is not None
    net.zero_grad(set_to_none=True)
    for entry in meta["replay"]:
        spec = dataclasses.replace(
            base_spec, max_seq_length=entry["max_seq_length"] or base_spec.max_seq_length
        )
        feats = _step_features(entry, rows, tok, fmt, spec)
        loss, norm = _train_step(trainer, feats, entry["per_device_train_batch_size"] or default_bs)
        outcomes.append(_outcome(entry, loss, norm))
        if entry["step"] == meta["step"]:
            by_sample = per_sample_loss(net, feats, entry["indices"], args.device)
            break
        if not (math.isfinite(loss) and math.isfinite(norm)):
            # The guard's skip: the optimizer then leaves every weight alone.
            net.zero_grad(set_to_none=True)
        _apply_recorded_lr(optimizer, entry, notes)
        optimizer.step()
        scheduler.step()
        net.zero_grad(set_to_none=True)
    if any(e.get("ranks", 1) > 1 for e in meta["replay"]):
        notes.append("multi-rank run: rank 0's batch replayed on one process; grad norms are not compared")
    res = _verdict(meta, ckpt, outcomes, notes)
    res.samples = by_sample
    return res


def _data_spec(cfg: Any, rows: dict[int, Any]) -> Any:
    """How the run encoded its rows: its format (as the rows show it, where the config says ``auto``)."""
    from steadytune.data.encode import DataSpec
    from steadytune.data.rows import detect_format

    d = cfg.data
    fmt = d.format if d.format != "auto" else detect_format([next(iter(rows.values()))], d.text_field)
    return DataSpec(d.train_file, fmt, d.text_field, d.max_seq_length, d.train_on_prompt)


def _outcome(entry: dict[str, Any], loss: float, norm: float) -> StepOutcome:
    """The replayed step beside its recording; a run of several ranks all-reduced its gradient norm, so
    only its loss is compared."""
    rec_loss, rec_norm = _f(entry.get("loss")), _f(entry.get("grad_norm"))
    norm_ok = entry.get("ranks", 1) > 1 or close(norm, rec_norm, NORM_RTOL, NORM_ATOL)
    same = close(loss, rec_loss, LOSS_RTOL, LOSS_ATOL) and norm_ok
    return StepOutcome(entry["step"], loss, norm, rec_loss, rec_norm, same)


def _trainer_at_checkpoint(cfg: Any, meta: dict[str, Any], ckpt: Path | None, tok: Any) -> Any:
    """An HF Trainer in the shape of the replayed steps, its optimizer, scheduler and RNG as the checkpoint
    left them (fresh without one)."""
    from transformers import Trainer

    from steadytune.records import PlanRevision
    from steadytune.train.runner import Collator, training_arguments

    last = meta["replay"][-1]
    plan = PlanRevision(
        revision=0,
        ts=0.0,
        reason="replay",
        per_device_train_batch_size=last["per_device_train_batch_size"],
        gradient_accumulation_steps=last["gradient_accumulation_steps"],
        lr_scale=last["lr_scale"],
        max_seq_length=last["max_seq_length"],
    )
    # The Trainer wants a folder it never writes to here: removed as this process exits.
    staging = owned_tempdir("steadytune-replay-")
    args = training_arguments(cfg, plan, staging, has_eval=False)
    net = _load_model(cfg, ckpt)
    trainer = Trainer(model=net, args=args, data_collator=Collator(tok.pad_token_id), processing_class=tok)
    max_steps = int(meta.get("max_steps") or cfg.train.max_steps)
    if max_steps <= 0:
        raise ValueError(
            "the bundle does not say how many steps the run had (max_steps); the LR schedule needs it"
        )
    trainer.create_optimizer_and_scheduler(num_training_steps=max_steps)
    if ckpt is not None:
        trainer._load_optimizer_and_scheduler(str(ckpt))  # the Trainer's own resume path
        trainer._load_rng_state(str(ckpt))
    return trainer


def _step_features(entry: dict[str, Any], rows: dict[int, Any], tok: Any, fmt: str, spec: Any) -> list[Any]:
    """The step's samples, encoded as the run encoded them; each checked against its recorded hash.

    Raises:
        ValueError: a sample is missing from the data, or changed since the run.
    """
    from steadytune.data.encode import encode_row, sample_hash

    feats = []
    for sid, recorded in zip(entry["indices"], entry["hashes"] + [""] * len(entry["indices"]), strict=False):
        if sid not in rows:
            raise ValueError(f"sample {sid} of step {entry['step']} is not in the data; pass --data PATH")
        enc = encode_row(tok, rows[sid], fmt, spec)
        if recorded and f"{sample_hash(enc['input_ids']):015x}" != recorded:
            raise ValueError(
                f"sample {sid} of step {entry['step']} changed since the run (content hash differs)"
            )
        feats.append(enc)
    return feats


def _train_step(trainer: Any, feats: list[Any], batch_size: int) -> tuple[float, float]:
    """One optimizer step's forward and backward passes, in micro-batches: its loss (NaN if any
    micro-batch's was not finite) and its gradient norm (clipped as the run clipped)."""
    import torch

    net, args = trainer.model, trainer.args
    batches = [trainer.data_collator(feats[k : k + batch_size]) for k in range(0, len(feats), batch_size)]
    num_items = trainer._get_num_items_in_batch(batches, args.device)
    trainer.current_gradient_accumulation_steps = len(batches)
    loss, bad = 0.0, False
    for mb in batches:
        value = float(trainer.training_step(net, mb, num_items))
        bad |= not math.isfinite(value)
        loss += value if math.isfinite(value) else 0.0
    params = [p for p in net.parameters() if p.grad is not None]
    if args.max_grad_norm and args.max_grad_norm > 0:
        norm = float(torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm))
    elif params:
        norm = float(torch.linalg.vector_norm(torch.stack([p.grad.detach().float().norm(2) for p in params])))
    else:
        norm = 0.0
    return (math.nan if bad else loss), norm


def _apply_recorded_lr(optimizer: Any, entry: dict[str, Any], notes: list[str]) -> None:
    """Update with the LR the run applied, and say so when it is not what the schedule gives.

    The schedule is rebuilt from the config; an LR changed outside it (an operator, an
    injected fault, a callback) would otherwise make the replay miss the very update that
    caused the anomaly. The scheduler's next step sets its own value again.
    """
    recorded = _f(entry.get("lr"))
    current = float(optimizer.param_groups[0]["lr"])
    if recorded is None or not current or close(current, recorded, 1e-6, 1e-12):
        return
    notes.append(
        f"step {entry['step']}: the run applied LR {recorded:.4g} where the schedule gives {current:.4g} "
        f"(x{recorded / current:.3g}): the LR was changed outside the schedule; replayed with the run's LR"
    )
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * recorded / current


def per_sample_loss(
    model: Any, feats: list[dict[str, Any]], ids: list[int], device: Any
) -> list[dict[str, Any]]:
    """Each sample's share of the step's loss: its summed token loss over the step's summed loss.

    The step loss is a token average over the whole batch, so a long or garbled sample can carry
    most of it; this names which one. One forward per sample, no gradients.
    """
    import torch

    was_training = model.training
    model.eval()  # no dropout: the shares should not depend on a random mask
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        for sid, f in zip(ids, feats, strict=False):
            inputs = torch.tensor([f["input_ids"]], device=device)
            labels = torch.tensor([f["labels"]], device=device)
            logits = model(input_ids=inputs).logits.float()
            ce = torch.nn.functional.cross_entropy(
                logits[0, :-1], labels[0, 1:], ignore_index=-100, reduction="sum"
            )
            rows.append(
                {"sample_id": int(sid), "tokens": int((labels[0, 1:] != -100).sum()), "loss_sum": float(ce)}
            )
    model.train(was_training)
    total = sum(r["loss_sum"] for r in rows if math.isfinite(r["loss_sum"]))
    for r in rows:
        r["mean_loss"] = r["loss_sum"] / r["tokens"] if r["tokens"] else None
        r["share"] = r["loss_sum"] / total if total else None
    return sorted(rows, key=lambda r: -(r["share"] or 0.0))


# The metrics a replay recomputes: the step's loss and its gradient norms (grad_norm/layers.0 too).
_REPLAYED_METRICS = ("loss", "grad_norm")


def replayed_anomaly(event: dict[str, Any]) -> bool:
    """Whether a replay can reproduce this anomaly event: one about the step's loss or gradients."""
    data = event.get("data") if isinstance(event.get("data"), dict) else {}
    metric = str((data or {}).get("metric") or "")
    if metric:
        return metric.split("/", 1)[0] in _REPLAYED_METRICS
    return str(event.get("name", "")).startswith(("nan", "loss", "grad", "diverg"))


def _verdict(
    meta: dict[str, Any], ckpt: Path | None, outcomes: list[StepOutcome], notes: list[str]
) -> ReplayResult:
    final = outcomes[-1]
    rec_bad = any(
        x is not None and not math.isfinite(x) for x in (final.recorded_loss, final.recorded_grad_norm)
    )
    rec_bad = rec_bad or bool(meta["replay"][-1].get("skipped"))
    raised = [e for e in meta.get("events_at_step", []) if e.get("kind") == "anomaly"]
    anomalies = [e.get("name") for e in raised if replayed_anomaly(e)]
    # A throughput drop, a stall, a memory alarm: the machine's, which a replay does not measure. It
    # read "REPRODUCED (throughput_drop)" when the step's loss matched, which says nothing of its speed.
    unreplayed = [str(e.get("name")) for e in raised if not replayed_anomaly(e)]
    if unreplayed:
        notes.append(
            f"{', '.join(unreplayed)} at this step is about its time or memory on the machine, which a "
            "replay does not measure: only the step's loss and gradient norm are compared"
        )
    anomaly = rec_bad or bool(anomalies)
    now_bad = not (math.isfinite(final.loss) and math.isfinite(final.grad_norm))
    drift = next((o for o in outcomes[:-1] if not o.matches), None)
    if drift is not None:
        notes.append(
            f"the replay drifted from the record first at step {drift.step} (loss {drift.loss:.6g} vs "
            f"{drift.recorded_loss}); see docs/forensics.md on determinism"
        )
    res = ReplayResult(
        meta["step"], meta["start_step"], ckpt.name if ckpt else None, "", "", anomaly, outcomes, notes
    )
    shown = (
        f"loss {final.loss:.6g} (recorded {final.recorded_loss}), grad norm {final.grad_norm:.6g} "
        f"(recorded {final.recorded_grad_norm})"
    )
    if rec_bad:
        res.verdict = "reproduced" if now_bad else "not_reproduced"
        res.message = (
            f"REPRODUCED: the step is non-finite again: {shown}"
            if now_bad
            else f"NOT REPRODUCED: the recorded step was non-finite, the replay is finite: {shown}"
        )
    elif anomaly:
        res.verdict = "reproduced" if final.matches else "not_reproduced"
        what = ", ".join(anomalies)
        res.message = (
            f"REPRODUCED ({what}): the replay matches the record within tolerance: {shown}"
            if final.matches
            else f"NOT REPRODUCED ({what}): {shown}"
        )
    elif now_bad:
        res.verdict, res.message = (
            "mismatch",
            f"MISMATCH: a healthy step turned non-finite in the replay: {shown}",
        )
    else:
        res.verdict = "healthy" if final.matches else "mismatch"
        res.message = (
            f"NO ANOMALY{' in its values' if unreplayed else ''}: the step replays healthy and matches "
            f"the record: {shown}"
            if final.matches
            else f"MISMATCH: the replay differs from the record beyond tolerance: {shown}"
        )
    return res


def check_bundle(
    bundle: str | Path,
    checkpoint: Path | None = None,
    data: Path | None = None,
    model: Path | None = None,
    trust_remote_code: bool = False,
    limits: UnpackLimits | None = None,
    run: Path | None = None,
) -> ReplayResult:
    """Replay a bundle (``.tar.gz`` or folder). See the module docstring for the verdicts.

    Nothing shipped in the bundle runs as code (see :func:`guard_code`), and unpacking
    stays within ``limits`` (see :func:`opened`).
    """
    # Deterministic kernels where the backend has them; must be set before CUDA initialises.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    with opened(Path(bundle), limits) as folder:
        try:
            meta = json.loads((folder / "bundle.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            meta = {}
        found = locate_run(meta if isinstance(meta, dict) else {}, Path(bundle), run)
        return replay(folder, checkpoint, data, model, trust_remote_code, found)


def render(res: ReplayResult) -> str:
    lines = [
        f"replayed steps {res.start_step + 1}-{res.step} from {res.checkpoint or 'the base model'}",
        "",
        f"  {'step':>6} {'loss':>12} {'recorded':>12} {'grad norm':>12} {'recorded':>12}  match",
    ]
    for o in res.steps:
        lines.append(
            f"  {o.step:>6} {o.loss:>12.6g} {o.recorded_loss!s:>12.12} {o.grad_norm:>12.6g} "
            f"{o.recorded_grad_norm!s:>12.12}  {'yes' if o.matches else 'NO'}"
        )
    if res.samples:
        lines += [
            "",
            f"step {res.step} loss by sample (no dropout):",
            f"  {'sample':>8} {'tokens':>7} {'mean loss':>10} {'share':>7}",
        ]
        for r in res.samples[:10]:
            mean = "0/0" if r["mean_loss"] is None else f"{r['mean_loss']:.4g}"
            share = "-" if r["share"] is None else f"{r['share']:.0%}"
            lines.append(f"  {r['sample_id']:>8} {r['tokens']:>7} {mean:>10} {share:>7}")
    lines += [f"note: {n}" for n in res.notes]
    lines += ["", f"verdict: {res.message}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="replay.py", description="replay a steadytune repro bundle")
    ap.add_argument("bundle", type=Path)
    ap.add_argument(
        "--checkpoint", type=Path, default=None, help="use this checkpoint folder instead of the bundle's"
    )
    ap.add_argument("--data", type=Path, default=None, help="use this dataset file instead of the run's")
    ap.add_argument("--model", type=Path, default=None, help="use this model folder instead of the run's")
    ap.add_argument(
        "--run",
        type=Path,
        default=None,
        help="the run the bundle came from, for the checkpoint, model and data its redacted paths name",
    )
    ap.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow model.trust_remote_code: true from the bundle's config (runs the model's own Python "
        "code: only for a bundle and a model you trust)",
    )
    add_limit_flags(ap)
    ap.add_argument("--format", choices=("text", "json"), default="text")
    args = ap.parse_args(argv)
    limits = UnpackLimits(args.max_unpacked_bytes, args.max_member_bytes, args.max_members)
    try:
        res = check_bundle(
            args.bundle, args.checkpoint, args.data, args.model, args.trust_remote_code, limits, args.run
        )
    except (FileNotFoundError, ValueError) as exc:  # UnsafeBundle is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(res.to_dict(), indent=1) if args.format == "json" else render(res))
    return 0 if res.ok else 1

"""``inspect-batch``: reload exactly the samples of one step and say what is wrong with them.

The guard recorded each step's sample ids and content hashes. This module reads
those rows back from the dataset named in the run's config, encodes them the way
the runner did (:func:`steadytune.data.encode.encode_row`, same sequence length
as the plan of that attempt), checks each one (:mod:`.batchchecks`) and returns
a :class:`BatchVerdict`.

It is torch-free by default so the supervisor can call :func:`inspect_step` in a
background thread after a spike, collapse or NaN. Sample text is never in a
verdict unless ``show_text`` is set: by default only hashes and token counts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steadytune.data.encode import DataSpec, encode_row, sample_hash
from steadytune.data.rows import DataError, detect_format, load_rows
from steadytune.forensics.batchchecks import (
    DOMINANT_MIN_BATCH,
    DOMINANT_SHARE,
    LONG_FACTOR,
    Finding,
    SampleFacts,
    TokenStats,
    check_batch,
    check_sample,
    level_of,
)
from steadytune.forensics.runview import load_run_config, plan_for_attempt, step_batch
from steadytune.forensics.tokenizer import (
    LightTokenizer,
    TokenizerUnavailable,
    load_hf_tokenizer,
    load_tokenizer,
    vocab_size,
)
from steadytune.regularfile import open_regular
from steadytune.rundir import RunDir

TEXT_LIMIT = 2000  # characters of each text field shown with --show-text


@dataclass(frozen=True)
class SampleVerdict:
    sample_id: int
    verdict: str  # ok / suspect / bad / missing
    findings: tuple[Finding, ...]
    stats: TokenStats | None
    recorded_hash: str
    current_hash: str
    row_sha256: str = ""  # of the raw row, so two reports can be compared without the text
    rank: int | None = None
    text: dict[str, Any] | None = None  # only with show_text

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sample_id": self.sample_id,
            "verdict": self.verdict,
            "findings": [f.to_dict() for f in self.findings],
            "stats": self.stats.to_dict() if self.stats else None,
            "recorded_hash": self.recorded_hash,
            "current_hash": self.current_hash,
            "row_sha256": self.row_sha256,
        }
        if self.text is not None:
            out["text"] = self.text
        return out


@dataclass(frozen=True)
class BatchVerdict:
    """The verdict on one optimizer step's batch, per sample and overall."""

    run_id: str
    step: int
    attempt: int
    verdict: str  # ok / suspect / bad / unknown
    summary: str
    samples: tuple[SampleVerdict, ...] = ()
    findings: tuple[Finding, ...] = ()
    loss: float | None = None
    grad_norm: float | None = None
    skipped: bool = False
    dataset: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def culprits(self) -> list[int]:
        """Sample ids judged bad (or suspect when none is bad)."""
        bad = [s.sample_id for s in self.samples if s.verdict in {"bad", "missing"}]
        return bad or [s.sample_id for s in self.samples if s.verdict == "suspect"]

    def to_dict(self) -> dict[str, Any]:
        loss = self.loss if self.loss is None or math.isfinite(self.loss) else str(self.loss)
        norm = (
            self.grad_norm if self.grad_norm is None or math.isfinite(self.grad_norm) else str(self.grad_norm)
        )
        return {
            "run_id": self.run_id,
            "step": self.step,
            "attempt": self.attempt,
            "verdict": self.verdict,
            "summary": self.summary,
            "culprits": self.culprits,
            "loss": loss,
            "grad_norm": norm,
            "skipped": self.skipped,
            "dataset": self.dataset,
            "notes": list(self.notes),
            "findings": [f.to_dict() for f in self.findings],
            "samples": [s.to_dict() for s in self.samples],
        }

    def event_data(self) -> dict[str, Any]:
        """A compact, text-free form to attach to an event (``Event.data``)."""
        return {
            "verdict": self.verdict,
            "summary": self.summary,
            "culprits": self.culprits[:16],
            "checks": sorted(
                {f.check for s in self.samples for f in s.findings} | {f.check for f in self.findings}
            ),
        }


def fetch_rows(
    path: str | Path, indices: set[int]
) -> tuple[dict[int, dict[str, Any]], dict[str, Any] | None]:
    """Rows ``indices`` of a dataset file (row id = position among non-blank rows) and its first row.

    JSONL is scanned line by line and only the wanted lines are parsed, so a
    large dataset costs one read, not one ``json.loads`` per row.
    """
    path = Path(path)
    if path.suffix.lower() not in {".jsonl", ".ndjson"}:
        rows = load_rows(path)
        return {i: rows[i] for i in indices if i < len(rows)}, (rows[0] if rows else None)
    if not path.exists():
        raise DataError(f"dataset {path} not found; it was moved or deleted since the run")
    found: dict[int, dict[str, Any]] = {}
    first: dict[str, Any] | None = None
    wanted = max(indices) if indices else -1
    row = -1
    with open_regular(path, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            if not line.strip():
                continue
            row += 1
            if row == 0 or row in indices:
                try:
                    obj = json.loads(line)
                except ValueError:
                    obj = {"__unparseable__": line[:200]}
                if row == 0:
                    first = obj
                if row in indices:
                    found[row] = obj
            if row >= wanted and first is not None:
                break
    return found, first


def _texts_and_floats(obj: Any, texts: list[str], floats: list[float]) -> None:
    if isinstance(obj, str):
        texts.append(obj)
    elif isinstance(obj, float):
        floats.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _texts_and_floats(v, texts, floats)
    elif isinstance(obj, list):
        for v in obj:
            _texts_and_floats(v, texts, floats)


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (v[:TEXT_LIMIT] + "…" if isinstance(v, str) and len(v) > TEXT_LIMIT else v) for k, v in row.items()
    }


def _spec(cfg: dict[str, Any], max_seq_length: int | None) -> DataSpec:
    d = cfg.get("data") or {}
    return DataSpec(
        str(d.get("train_file", "")),
        d.get("format") or "auto",
        d.get("text_field") or "text",
        int(max_seq_length or d.get("max_seq_length") or 512),
        bool(d.get("train_on_prompt", False)),
        d.get("max_samples"),
    )


def _check_one(
    sid: int,
    recorded: str,
    row: dict[str, Any] | None,
    tok: Any,
    fmt: str,
    spec: DataSpec,
    vocab: int,
    show_text: bool,
) -> SampleVerdict:
    if row is None:
        f = Finding(
            "missing_row", "critical", f"row {sid} is not in {spec.path} any more: the dataset shrank"
        )
        return SampleVerdict(sid, "missing", (f,), None, recorded, "")
    if spec.max_samples and sid >= spec.max_samples:
        f = Finding("missing_row", "critical", f"row {sid} is past data.max_samples={spec.max_samples}")
        return SampleVerdict(sid, "missing", (f,), None, recorded, "")
    row_sha = hashlib.sha256(
        json.dumps(row, sort_keys=True, default=str).encode("utf-8", "surrogatepass")
    ).hexdigest()[:16]
    texts: list[str] = []
    floats: list[float] = []
    _texts_and_floats(row, texts, floats)
    try:
        enc = encode_row(tok, row, fmt, spec)
        full = encode_row(tok, row, fmt, dataclasses.replace(spec, max_seq_length=1 << 30))
    except Exception as exc:  # the runner would have failed on this row the same way
        f = Finding("encoding_error", "critical", f"encoding failed: {type(exc).__name__}: {exc}")
        return SampleVerdict(
            sid, "bad", (f,), None, recorded, "", row_sha, text=_shown(row) if show_text else None
        )
    current = f"{sample_hash(enc['input_ids']):015x}"
    specials = frozenset(getattr(tok, "all_special_ids", []) or [])
    facts = SampleFacts(
        input_ids=enc["input_ids"],
        labels=enc["labels"],
        vocab_size=vocab,
        special_ids=specials,
        pad_id=getattr(tok, "pad_token_id", None),
        unk_id=getattr(tok, "unk_token_id", None),
        max_seq_length=spec.max_seq_length,
        untruncated_len=len(full["input_ids"]),
        raw_texts=tuple(texts),
        raw_floats=tuple(floats),
        recorded_hash=recorded,
        current_hash=current,
    )
    findings, stats = check_sample(facts)
    return SampleVerdict(
        sid,
        level_of(findings),
        tuple(findings),
        stats,
        recorded,
        current,
        row_sha,
        text=_shown(row) if show_text else None,
    )


def _flag_outliers(samples: list[SampleVerdict]) -> list[SampleVerdict]:
    """Findings only the batch can show: a sample far longer than the rest, or one that holds most of
    the trained tokens (the step's loss is a token average, so it is mostly that sample's loss)."""
    lengths = sorted(s.stats.tokens for s in samples if s.stats and s.stats.tokens)
    median = lengths[len(lengths) // 2] if len(lengths) >= 3 else 0
    trained = sum(s.stats.trained for s in samples if s.stats)
    out = []
    for s in samples:
        extra = []
        if s.stats and median and s.stats.tokens > LONG_FACTOR * median:
            extra.append(
                Finding(
                    "too_long",
                    "warning",
                    f"{s.stats.tokens} tokens, {s.stats.tokens / median:.0f}x the batch median",
                )
            )
        if (
            s.stats
            and trained
            and len(samples) >= DOMINANT_MIN_BATCH
            and s.stats.trained / trained > DOMINANT_SHARE
        ):
            extra.append(
                Finding(
                    "dominates_loss",
                    "warning",
                    f"holds {s.stats.trained / trained:.0%} of the step's {trained} trained tokens: the "
                    "step's loss is mostly this sample's",
                )
            )
        if extra:
            findings = (*s.findings, *extra)
            s = dataclasses.replace(s, findings=findings, verdict=level_of(findings))
        out.append(s)
    return out


def _summary(step: int, verdict: str, samples: list[SampleVerdict], batch: list[Finding]) -> str:
    head = f"step {step}: {verdict.upper()}"
    named = [s for s in samples if s.verdict in {"bad", "missing"}] or [
        s for s in samples if s.verdict == "suspect"
    ]
    parts = [f"sample {s.sample_id} ({'; '.join(f.check for f in s.findings)})" for s in named[:5]]
    if len(named) > 5:
        parts.append(f"and {len(named) - 5} more")
    parts += [f.message for f in batch if f.level == "critical"]
    if not parts:
        return f"{head} — {len(samples)} sample(s), nothing wrong found"
    return f"{head} — " + "; ".join(parts)


def _all_hashes_differ(samples: list[SampleVerdict]) -> bool:
    return bool(samples) and all(
        s.recorded_hash and s.current_hash and s.recorded_hash != s.current_hash for s in samples
    )


def _run_tokenizer(
    model: dict[str, Any], chat: bool, allow_transformers: bool, trust_remote_code: bool
) -> tuple[Any, str]:
    """The run's tokenizer, or None and why it could not be had (``chat``: it needs a chat template).

    Only the caller's ``trust_remote_code`` is followed: a run folder's config may come from anyone
    who could write it.
    """
    try:
        tok = load_tokenizer(
            model.get("name_or_path", ""),
            needs_chat_template=chat,
            allow_transformers=allow_transformers,
            trust_remote_code=trust_remote_code,
        )
    except (TokenizerUnavailable, OSError, ValueError) as exc:
        why = str(exc)
        if model.get("trust_remote_code") is True and not trust_remote_code:
            why += (
                "; the run's config sets model.trust_remote_code, which would run the model folder's "
                "own Python: a run folder's config is not trusted for that, pass --trust-remote-code if "
                "you trust the model folder"
            )
        return None, why
    return tok, ""


def inspect_step(
    run_dir: RunDir | str | Path,
    step: int,
    show_text: bool = False,
    *,
    allow_transformers: bool = False,
    attempt: int | None = None,
    trust_remote_code: bool = False,
) -> BatchVerdict:
    """Reload the samples of ``step`` and judge each one and the batch.

    Args:
        run_dir: the run directory.
        step: the optimizer step (the latest attempt of that step is used).
        show_text: put the raw rows into the verdict (off: hashes and token statistics only).
        allow_transformers: load the tokenizer with transformers when the light one cannot
            (chat templates, no ``tokenizer.json``). That imports torch: leave it off in the supervisor.
        attempt: read the step as this worker attempt recorded it (default: the latest attempt).
        trust_remote_code: let transformers run the model folder's own Python. Only ever the
            caller's (``--trust-remote-code``): the run folder's ``config.yaml`` may come from
            anyone who could write it, so its ``model.trust_remote_code`` is never followed.

    Raises:
        ForensicsError: the step is unknown or has no batch fingerprint.
    """
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
    batch = step_batch(run, step, attempt=attempt)
    cfg = load_run_config(run)
    plan = plan_for_attempt(run, batch.attempt)
    spec = _spec(cfg, plan.max_seq_length)
    base = BatchVerdict(
        run.run_id,
        step,
        batch.attempt,
        "unknown",
        "",
        loss=batch.loss,
        grad_norm=batch.grad_norm,
        skipped=batch.skipped,
        dataset=spec.path,
    )
    try:
        rows, first = fetch_rows(spec.path, set(batch.indices))
        fmt = (
            spec.format if spec.format != "auto" else detect_format([first] if first else [], spec.text_field)
        )
    except DataError as exc:
        return dataclasses.replace(
            base, summary=f"step {step}: cannot read the dataset: {exc}", notes=(str(exc),)
        )
    model = cfg.get("model") or {}
    tok, why = _run_tokenizer(model, fmt == "messages", allow_transformers, trust_remote_code)
    if tok is None:
        return dataclasses.replace(base, summary=f"step {step}: not checked: {why}", notes=(why,))
    vocab = vocab_size(model.get("name_or_path", ""), tok)
    samples = [
        _check_one(sid, h, rows.get(sid), tok, fmt, spec, vocab, show_text)
        for sid, h in zip(batch.indices, batch.hashes, strict=True)
    ]
    if allow_transformers and isinstance(tok, LightTokenizer) and _all_hashes_differ(samples):
        # The light tokenizer may normalise differently from transformers' wrapper: ask the real one.
        tok = load_hf_tokenizer(model.get("name_or_path", ""), trust_remote_code)
        samples = [
            _check_one(sid, h, rows.get(sid), tok, fmt, spec, vocab, show_text)
            for sid, h in zip(batch.indices, batch.hashes, strict=True)
        ]
    samples = _flag_outliers(samples)
    batch_findings = check_batch([s.stats for s in samples if s.stats is not None])
    verdict = level_of([f for s in samples for f in s.findings] + batch_findings)
    notes = []
    if _all_hashes_differ(samples):
        notes.append("every hash differs: the dataset, the tokenizer or max_seq_length changed since the run")
    return dataclasses.replace(
        base,
        verdict=verdict,
        summary=_summary(step, verdict, samples, batch_findings),
        samples=tuple(samples),
        findings=tuple(batch_findings),
        notes=tuple(notes),
    )

"""The dataset scan: raw bytes, rows, then tokens with the model's tokenizer and the run's cache.

Tokenizing goes through :func:`steadytune.train.data.build_dataset`, so the entry the
scan builds is the one the run loads (same key: content, tokenizer, template, sequence
length): the scan's cost is paid once. When the file cannot go through the loader
(invalid UTF-8, bad JSON) the rows that could be read are tokenized directly instead,
so the other defects are still reported in the same pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steadytune.config.schema import SteadytuneConfig
from steadytune.estimate import Architecture
from steadytune.preflight.dataset import content_findings, scan_raw, show_lines, token_stats
from steadytune.preflight.result import Check, fail, na, ok, warn
from steadytune.train.data import load_tokenizer

# Any of these in a model folder means a tokenizer may load from it.
TOKENIZER_MARKERS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "spiece.model",
)


@dataclass
class DataScan:
    checks: list[Check] = field(default_factory=list)
    samples: int | None = None
    total_tokens: int | None = None
    longest: int | None = None
    cache_need_bytes: int = 0


def raw_checks(path: str, label: str = "") -> tuple[list[Check], Any]:
    """UTF-8, JSON and readability of one file; returns the checks and the :class:`RawScan`."""
    f, pre = "data", label
    if not Path(path).exists():
        return [
            fail(f, f"{pre}data_file", f"{path} does not exist", "fix data.train_file / data.eval_file")
        ], None
    raw = scan_raw(path)
    out: list[Check] = []
    if raw.invalid_utf8:
        where = ", ".join(f"line {ln} (byte {off})" for ln, off in raw.invalid_utf8[:5])
        more = f" (+{len(raw.invalid_utf8) - 5} more)" if len(raw.invalid_utf8) > 5 else ""
        out.append(
            fail(
                f,
                f"{pre}utf8",
                f"{Path(path).name}: invalid UTF-8 at {where}{more}; the loader stops there",
                "re-encode the file as UTF-8 (iconv -f LATIN1 -t UTF-8) or remove those lines",
                lines=[ln for ln, _ in raw.invalid_utf8],
            )
        )
    elif Path(path).suffix.lower() != ".parquet":
        out.append(ok(f, f"{pre}utf8", f"{Path(path).name}: valid UTF-8 ({raw.size_bytes:,} bytes)"))
    if raw.bad_json:
        out.append(
            fail(
                f,
                f"{pre}json",
                f"not valid JSON at {show_lines([n for n, _ in raw.bad_json])}: {raw.bad_json[0][1]}",
                "fix or remove those lines",
                lines=[n for n, _ in raw.bad_json],
            )
        )
    if raw.error:
        out.append(fail(f, f"{pre}data_file", raw.error, "fix the file or data.format"))
    return out, raw


def scan_data(
    cfg: SteadytuneConfig,
    arch: Architecture | None,
    tokenizer_loader: Callable[[str, bool], Any] | None = load_tokenizer,
) -> DataScan:
    """Every data check for the train file (and the byte-level ones for the eval file).

    Args:
        cfg: the run config.
        arch: the model's architecture, for the vocabulary size; None skips that check.
        tokenizer_loader: loads the tokenizer; None skips the token-level checks.
    """
    from steadytune.data.encode import DataSpec
    from steadytune.data.rows import DataError, detect_format

    d = cfg.data
    result = DataScan()
    checks, raw = raw_checks(d.train_file)
    result.checks += checks
    if d.eval_file:
        result.checks += [c for c in raw_checks(d.eval_file, "eval_")[0] if c.status != "ok"]
    if raw is None or raw.error:
        return result
    rows, lines = raw.rows, raw.lines
    if d.max_samples:
        rows, lines = rows[: d.max_samples], lines[: d.max_samples]
    if not rows:
        result.checks.append(
            fail("data", "format", f"{d.train_file} holds no samples", "add samples to the file")
        )
        return result
    try:
        fmt = d.format if d.format != "auto" else detect_format(rows, d.text_field)
    except DataError as exc:
        result.checks.append(
            fail("data", "format", str(exc), "set data.format / data.text_field to match the file")
        )
        return result
    result.samples = len(rows)
    result.cache_need_bytes = 2 * raw.size_bytes  # arrow int64 ids + labels: about the text's size twice
    result.checks.append(
        ok(
            "data",
            "format",
            f"{fmt} format, {len(rows)} samples"
            + (f", {raw.blank_lines} blank lines skipped" if raw.blank_lines else ""),
        )
    )
    result.checks += _content_checks(content_findings(rows, lines, fmt, d.text_field), len(rows))

    if tokenizer_loader is None:
        return result
    tok, missing = _tokenizer(cfg, tokenizer_loader)
    if missing is not None:
        result.checks.append(missing)
        return result
    if fmt == "messages":
        if not getattr(tok, "chat_template", None):
            result.checks.append(
                fail(
                    "data",
                    "chat_template",
                    "messages format, but the tokenizer has no chat template",
                    "use a tokenizer with a chat template (an -Instruct model), or format instruction/text",
                )
            )
            return result
        result.checks.append(ok("data", "chat_template", "the tokenizer has a chat template"))
    spec = DataSpec(d.train_file, fmt, d.text_field, d.max_seq_length, d.train_on_prompt, d.max_samples)
    encoded, how = _encode(tok, spec, rows, fmt, clean=not (raw.invalid_utf8 or raw.bad_json))
    result.cache_need_bytes = 0 if how == "cache" else result.cache_need_bytes
    _token_checks(result, tok, spec, rows, lines, fmt, encoded, arch, how)
    return result


def _tokenizer(
    cfg: SteadytuneConfig, tokenizer_loader: Callable[[str, bool], Any]
) -> tuple[Any, Check | None]:
    """The model's tokenizer, or None and the check that says why the token-level checks are skipped."""
    folder = Path(cfg.model.name_or_path).expanduser()
    if folder.is_dir() and not any((folder / name).exists() for name in TOKENIZER_MARKERS):
        # Shapes only (a config.json to plan with): say so without importing transformers.
        return None, na(
            "data",
            "tokenizer",
            f"no tokenizer files in {folder}; token-level checks skipped",
            "put the tokenizer files next to config.json to check lengths and labels",
        )
    try:
        return tokenizer_loader(cfg.model.name_or_path, cfg.model.trust_remote_code), None
    except Exception as exc:
        return None, na(
            "data",
            "tokenizer",
            f"no tokenizer at {cfg.model.name_or_path} ({type(exc).__name__}); token-level checks skipped",
            "put the tokenizer files next to config.json to check lengths and labels",
        )


def _encode(
    tok: Any, spec: Any, rows: list[dict[str, Any]], fmt: str, clean: bool
) -> tuple[list[dict[str, list[int]]], str]:
    from steadytune.data.encode import encode_row
    from steadytune.train.data import build_dataset

    if clean:
        ds = build_dataset(tok, spec)
        return [
            {"input_ids": list(i), "labels": list(lb)}
            for i, lb in zip(ds["input_ids"], ds["labels"], strict=True)
        ], "cache"
    return [encode_row(tok, row, fmt, spec) for row in rows], "direct"


def count(n: int, singular: str) -> str:
    """``count(1, "empty sample")`` -> ``"1 empty sample"``; the plural adds an s to the noun."""
    if n == 1:
        return f"1 {singular}"
    head, _, tail = singular.partition(" with ")
    return f"{n} {head}s" + (f" with {tail}" if tail else "")


def _content_checks(found: dict[str, list[int]], n: int) -> list[Check]:
    f = "data"
    out = []
    texts = {
        "empty": ("empty sample", "remove them: they train on nothing but the template"),
        "whitespace": ("whitespace-only sample", "remove them or fill them in"),
        "empty_answer": (
            "sample with an empty answer",
            "remove them: they teach the model to answer nothing",
        ),
    }
    for kind, (what, fix) in texts.items():
        if found[kind]:
            out.append(
                warn(
                    f,
                    kind,
                    f"{count(len(found[kind]), what)} ({show_lines(found[kind])})",
                    fix,
                    lines=found[kind],
                )
            )
    if not (found["empty"] or found["whitespace"]):
        out.append(ok(f, "empty", "no empty or whitespace-only samples"))
    dups = found["duplicate"]
    if dups:
        pairs = ", ".join(f"{a} = {b}" for a, b in list(zip(dups, found["duplicate_of"], strict=True))[:5])
        out.append(
            warn(
                f,
                "duplicates",
                f"{count(len(dups), 'duplicate sample')} ({100 * len(dups) / n:.1f}%): "
                f"line{'s' if len(dups) > 1 else ''} {pairs}" + (" ..." if len(dups) > 5 else ""),
                "deduplicate: repeats are memorised and skew the loss",
                lines=dups,
            )
        )
    else:
        out.append(ok(f, "duplicates", "no duplicate samples"))
    return out


def _token_checks(
    result: DataScan,
    tok: Any,
    spec: Any,
    rows: list[dict[str, Any]],
    lines: list[int],
    fmt: str,
    encoded: list[dict[str, list[int]]],
    arch: Architecture | None,
    how: str,
) -> None:
    from steadytune.data.encode import encode_row

    f = "data"
    seq = spec.max_seq_length
    unbounded = dataclasses.replace(spec, max_seq_length=1 << 30)

    def true_length(i: int) -> int:
        return len(encode_row(tok, rows[i], fmt, unbounded)["input_ids"])

    vocab = arch.vocab_size if arch is not None else None
    stats = token_stats(encoded, lines, seq, vocab, true_length)
    result.total_tokens, result.longest = stats.total_tokens, stats.longest
    source = (
        "tokenized via the data cache"
        if how == "cache"
        else "tokenized directly (the file cannot go through the loader)"
    )
    result.checks.append(
        ok(
            f,
            "tokens",
            f"{stats.samples} samples, {stats.total_tokens:,} tokens, longest "
            f"{stats.longest_untruncated}, p95 {stats.p95} ({source})",
            longest=stats.longest_untruncated,
            p95=stats.p95,
            total_tokens=stats.total_tokens,
        )
    )
    if stats.truncated:
        share = len(stats.truncated) / stats.samples
        worst = max(stats.truncated, key=lambda t: t[1])
        text = (
            f"{len(stats.truncated)} of {stats.samples} samples ({100 * share:.1f}%) "
            f"{'exceeds' if len(stats.truncated) == 1 else 'exceed'} max_seq_length {seq} "
            f"and are truncated ({show_lines([ln for ln, _ in stats.truncated])}; longest {worst[1]} tokens "
            f"at line {worst[0]})"
        )
        limit = arch.max_position_embeddings if arch is not None else None
        if limit is not None and worst[1] > limit:
            fix = f"shorten those samples (the model has {limit} positions), or accept the truncation"
        else:
            fix = f"raise data.max_seq_length toward {worst[1]} if memory allows, or shorten those samples"
        # Truncation is a choice for some data (long documents cut to a window), so it never blocks.
        result.checks.append(
            warn(f, "over_long", text, fix, lines=[ln for ln, _ in stats.truncated], share=share)
        )
    else:
        result.checks.append(ok(f, "over_long", f"no sample exceeds max_seq_length {seq}"))
    if stats.all_masked:
        every = len(stats.all_masked) == stats.samples
        why = (
            "the prompt fills max_seq_length and the answer is cut off"
            if any(ln in {t[0] for t in stats.truncated} for ln in stats.all_masked)
            else "no answer tokens"
        )
        text = (
            f"{count(len(stats.all_masked), 'sample')} with every label masked "
            f"({show_lines(list(stats.all_masked))}): "
            f"they carry no loss ({why}); a batch of only such samples has a NaN loss"
        )
        fix = (
            "shorten their prompts or raise max_seq_length; set data.train_on_prompt: true if prompts should "
            "train too"
        )
        result.checks.append(
            (fail if every else warn)(f, "all_masked", text, fix, lines=list(stats.all_masked))
        )
    else:
        result.checks.append(ok(f, "all_masked", "every sample carries loss"))
    if vocab is None:
        result.checks.append(na(f, "label_vocab", "model vocabulary unknown"))
    elif stats.over_vocab:
        top = max(t for _, t in stats.over_vocab)
        result.checks.append(
            fail(
                f,
                "label_vocab",
                f"{count(len(stats.over_vocab), 'sample')} with token ids >= the "
                "model's "
                f"vocab_size {vocab} (up to {top}; {show_lines([ln for ln, _ in stats.over_vocab])}): "
                "the embedding lookup fails (a CUDA device-side assert on GPU)",
                "resize the embeddings (model.resize_token_embeddings) or use the model's own tokenizer",
                max_id=top,
            )
        )
    else:
        extra = f"; the tokenizer has {len(tok)} tokens" if len(tok) > vocab else ""
        result.checks.append(ok(f, "label_vocab", f"every token id < vocab_size {vocab}{extra}"))

"""Checks on one tokenized training sample: pure functions, no tokenizer, no torch.

Each check looks for one way a sample can wreck a step: nothing to read, nothing
to learn (every label masked), ids the embedding does not have, NaN in float
features, text cut off by truncation, floods of special or repeated tokens,
broken encodings, and content that changed since the run recorded its hash.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

IGNORE_INDEX = -100
Level = Literal["critical", "warning"]

# Flood thresholds: generous, because real data has some repetition (lists, code).
SPECIAL_SHARE = 0.5
REPEAT_SHARE = 0.5
MAX_RUN = 32
FLOOD_MIN_TOKENS = 16
SHORT_TOKENS = 4
LONG_FACTOR = 8.0
DOMINANT_SHARE = 0.5  # of a step's trained tokens held by one sample
DOMINANT_MIN_BATCH = 4


@dataclass(frozen=True)
class Finding:
    """One thing wrong with a sample (or a batch)."""

    check: str
    level: Level
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"check": self.check, "level": self.level, "message": self.message}


@dataclass(frozen=True)
class TokenStats:
    tokens: int
    trained: int
    special: int
    distinct: int
    top_share: float
    longest_run: int
    untruncated: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class SampleFacts:
    """What the checks need to know about one sample; built by the caller."""

    input_ids: Sequence[int]
    labels: Sequence[int]
    vocab_size: int
    special_ids: frozenset[int] = frozenset()
    pad_id: int | None = None
    unk_id: int | None = None
    max_seq_length: int | None = None
    untruncated_len: int | None = None
    raw_texts: tuple[str, ...] = ()
    raw_floats: tuple[float, ...] = ()
    recorded_hash: str = ""
    current_hash: str = ""
    extra_findings: tuple[Finding, ...] = field(default=())


def trained_positions(labels: Sequence[int]) -> int:
    """Labels that reach the loss. The first label is never predicted (labels shift by one)."""
    return sum(1 for x in labels[1:] if x != IGNORE_INDEX)


def longest_run(ids: Sequence[int]) -> int:
    best = run = 0
    prev: int | None = None
    for i in ids:
        run = run + 1 if i == prev else 1
        prev = i
        best = max(best, run)
    return best


def token_stats(f: SampleFacts) -> TokenStats:
    ids = list(f.input_ids)
    counts = Counter(ids)
    top = counts.most_common(1)[0][1] / len(ids) if ids else 0.0
    return TokenStats(
        tokens=len(ids),
        trained=trained_positions(f.labels),
        special=sum(1 for i in ids if i in f.special_ids),
        distinct=len(counts),
        top_share=round(top, 4),
        longest_run=longest_run(ids),
        untruncated=f.untruncated_len,
    )


def _bad_text(texts: Iterable[str]) -> str | None:
    for t in texts:
        if "\ufffd" in t:
            return "contains U+FFFD replacement characters (the file was decoded with the wrong encoding)"
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:
            return "contains lone surrogates (broken UTF-16 in the source)"
        ctrl = [c for c in t if ord(c) < 32 and c not in "\n\r\t"]
        if ctrl:
            return f"contains {len(ctrl)} control character(s) such as {ctrl[0]!r}"
    return None


def check_sample(f: SampleFacts) -> tuple[list[Finding], TokenStats]:
    """Every finding for one sample, worst first, and its token statistics."""
    out: list[Finding] = list(f.extra_findings)
    st = token_stats(f)
    ids, labels = list(f.input_ids), list(f.labels)
    content = [i for i in ids if i not in f.special_ids]
    if f.recorded_hash and f.current_hash and f.recorded_hash != f.current_hash:
        out.append(
            Finding(
                "hash_mismatch",
                "critical",
                f"content hash {f.current_hash} != recorded {f.recorded_hash}: the dataset changed since the "
                "run, so this is not the sample that was trained",
            )
        )
    if not ids:
        out.append(Finding("empty_input", "critical", "no input tokens at all"))
    elif not content:
        out.append(Finding("empty_input", "critical", f"only special tokens ({len(ids)}): the text is empty"))
    if ids and f.pad_id is not None and len(ids) > 1 and all(i == f.pad_id for i in ids):
        out.append(Finding("all_padding", "critical", "every input token is padding"))
    if ids and st.trained == 0:
        why = " (the answer was cut off by truncation)" if (f.untruncated_len or 0) > len(ids) else ""
        out.append(
            Finding(
                "all_labels_masked",
                "critical",
                f"every label is {IGNORE_INDEX}{why}: nothing to learn; alone in a batch the loss is 0/0 "
                f"= NaN",
            )
        )
    elif st.trained and all(x in f.special_ids for x in labels[1:] if x != IGNORE_INDEX):
        out.append(Finding("empty_target", "warning", "only special tokens are trained (an empty answer)"))
    bad_labels = [x for x in labels if x != IGNORE_INDEX and not 0 <= x < f.vocab_size]
    if bad_labels:
        out.append(
            Finding(
                "label_out_of_vocab",
                "critical",
                f"{len(bad_labels)} label id(s) outside the vocabulary [0, {f.vocab_size}) such as "
                f"{bad_labels[0]}",
            )
        )
    bad_ids = [x for x in ids if not 0 <= x < f.vocab_size]
    if bad_ids:
        out.append(
            Finding(
                "input_out_of_vocab",
                "critical",
                f"{len(bad_ids)} input id(s) outside the vocabulary [0, {f.vocab_size}) such as {bad_ids[0]}",
            )
        )
    nonfinite = [x for x in f.raw_floats if not math.isfinite(x)]
    if nonfinite:
        out.append(
            Finding(
                "nonfinite_input", "critical", f"{len(nonfinite)} non-finite float value(s) ({nonfinite[0]})"
            )
        )
    if f.untruncated_len is not None and f.max_seq_length and f.untruncated_len > len(ids):
        out.append(
            Finding(
                "truncated",
                "warning",
                f"truncated from {f.untruncated_len} to {len(ids)} tokens (max_seq_length "
                f"{f.max_seq_length})",
            )
        )
    if ids and len(content) < SHORT_TOKENS and content:
        out.append(Finding("too_short", "warning", f"only {len(content)} content token(s)"))
    if len(ids) >= FLOOD_MIN_TOKENS:
        if st.special / len(ids) > SPECIAL_SHARE:
            out.append(
                Finding(
                    "special_flood",
                    "warning",
                    f"{st.special / len(ids):.0%} of the tokens are special tokens",
                )
            )
        if st.top_share > REPEAT_SHARE or st.longest_run >= MAX_RUN:
            out.append(
                Finding(
                    "repeat_flood",
                    "warning",
                    f"one token is {st.top_share:.0%} of the sample, longest run {st.longest_run}",
                )
            )
    if f.unk_id is not None and f.unk_id in ids:
        out.append(
            Finding(
                "encoding_error",
                "warning",
                f"{ids.count(f.unk_id)} unknown token(s): text the tokenizer cannot represent",
            )
        )
    text_issue = _bad_text(f.raw_texts)
    if text_issue:
        out.append(Finding("encoding_error", "warning", text_issue))
    out.sort(key=lambda x: 0 if x.level == "critical" else 1)
    return out, st


def check_batch(stats: list[TokenStats]) -> list[Finding]:
    """Findings that only show across the batch: no trained token at all, length outliers."""
    out: list[Finding] = []
    if stats and sum(s.trained for s in stats) == 0:
        out.append(
            Finding(
                "batch_no_trained_tokens",
                "critical",
                "no sample of this step has a trained token: the mean loss is 0/0 = NaN",
            )
        )
    lengths = sorted(s.tokens for s in stats if s.tokens)
    if len(lengths) >= 3:
        median = lengths[len(lengths) // 2]
        longest = lengths[-1]
        if median and longest > LONG_FACTOR * median:
            out.append(
                Finding(
                    "length_outlier",
                    "warning",
                    f"the longest sample has {longest} tokens, {longest / median:.0f}x the median {median}",
                )
            )
    return out


def level_of(findings: Iterable[Finding]) -> str:
    """``bad`` with any critical finding, ``suspect`` with warnings only, else ``ok``."""
    levels = {f.level for f in findings}
    return "bad" if "critical" in levels else ("suspect" if levels else "ok")

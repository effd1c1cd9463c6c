"""What a preflight finds: one :class:`Check` per question, a recommendation, a verdict.

Every check module returns plain :class:`Check` values, so the families stay
independent and the verdict is one rule: any ``fail`` is a no-go, everything else
(``ok``, ``warn``, ``na``) is a go. A reading that is unavailable is ``na``, never
an exception and never a failure by itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "warn", "fail", "na"]

# The order families are shown in: what decides go/no-go first.
FAMILIES = ("memory", "system", "versions", "config", "data")

SYMBOLS: dict[str, str] = {"ok": "✓", "warn": "⚠", "fail": "✗", "na": "–"}


@dataclass(frozen=True)
class Check:
    """One answered question.

    Attributes:
        family: ``memory``, ``system``, ``versions``, ``config`` or ``data``.
        name: a short, stable identifier (``device_memory``, ``lr``, ``utf8``, ...); tests
            and the JSON output key on it.
        status: ``ok``, ``warn``, ``fail`` (no-go) or ``na`` (could not be judged).
        reason: what was found, with the numbers.
        fix: what to change; empty when nothing needs changing.
        data: the numbers behind the reason, for programs.
    """

    family: str
    name: str
    status: Status
    reason: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def ok(family: str, name: str, reason: str, **data: Any) -> Check:
    return Check(family, name, "ok", reason, "", data)


def warn(family: str, name: str, reason: str, fix: str, **data: Any) -> Check:
    return Check(family, name, "warn", reason, fix, data)


def fail(family: str, name: str, reason: str, fix: str, **data: Any) -> Check:
    return Check(family, name, "fail", reason, fix, data)


def na(family: str, name: str, reason: str, fix: str = "", **data: Any) -> Check:
    return Check(family, name, "na", reason, fix, data)


@dataclass(frozen=True)
class Recommendation:
    """The training shape that fits, keeping the effective batch.

    Attributes:
        per_device_train_batch_size: the micro-batch to use.
        gradient_accumulation_steps: accumulation that keeps ``effective_batch``.
        max_seq_length: the sequence length to use.
        gradient_checkpointing: whether to turn it on.
        effective_batch: micro-batch x accumulation (per device) kept by the recommendation.
        peak_bytes: the estimated peak of the recommended shape.
        budget_bytes: the memory it was fitted into (free memory minus headroom).
        notes: why each value was chosen.
    """

    per_device_train_batch_size: int | None
    gradient_accumulation_steps: int | None
    max_seq_length: int | None
    gradient_checkpointing: bool | None
    effective_batch: int | None = None
    peak_bytes: int | None = None
    budget_bytes: int | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PreflightReport:
    """Everything ``steadytune check`` says."""

    checks: tuple[Check, ...]
    recommendation: Recommendation | None = None
    device: str = "cpu"
    config_path: str | None = None

    @property
    def go(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    @property
    def verdict(self) -> str:
        return "go" if self.go else "no-go"

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(SYMBOLS, 0)
        for c in self.checks:
            out[c.status] += 1
        return out

    def find(self, name: str) -> list[Check]:
        """Every check called ``name`` (a data defect may appear once per kind)."""
        return [c for c in self.checks if c.name == name]

    def sorted_checks(self) -> list[Check]:
        order = {f: i for i, f in enumerate(FAMILIES)}
        return sorted(self.checks, key=lambda c: order.get(c.family, len(order)))


def to_json(report: PreflightReport) -> dict[str, Any]:
    """The machine-readable contract of ``steadytune check --format json``."""
    rec = asdict(report.recommendation) if report.recommendation else None
    if rec is not None:
        rec["notes"] = list(rec["notes"])
    return {
        "verdict": report.verdict,
        "go": report.go,
        "device": report.device,
        "config": report.config_path,
        "counts": report.counts(),
        "checks": [asdict(c) for c in report.sorted_checks()],
        "recommendation": rec,
    }


def from_json(data: dict[str, Any]) -> PreflightReport:
    """Rebuild a report from :func:`to_json` output (``run`` reads its child's answer)."""
    checks = tuple(Check(**c) for c in data.get("checks", []))
    rec = data.get("recommendation")
    recommendation = None
    if isinstance(rec, dict):
        recommendation = Recommendation(**{**rec, "notes": tuple(rec.get("notes", ()))})
    return PreflightReport(checks, recommendation, str(data.get("device", "cpu")), data.get("config"))

"""What every detector is, what it says, and the small helper every detector uses to say it once.

A detector is a :class:`Detector`: it is shown one point at a time (a record, see
:mod:`.points`) and appends what it found to a list, nothing else. It evaluates
conditions (``loss_spike`` on ``loss``, ``memory_leak`` on ``mem_allocated_bytes``
of rank 2, ...) and reports a :class:`Finding` while a condition holds, then one
inactive finding when it clears. The live engine turns the first active finding
into a *raised* transition, later ones into updates of the same anomaly, and the
clearing one into *resolved*. The kinds a detector may report are named by it
(``reports``); the words people read about each kind (:class:`KindInfo`) sit beside
the rule that finds it, in the module that introduces the kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from steadytune.records import Severity

P_contra = TypeVar("P_contra", contravariant=True)


class Detector(Protocol[P_contra]):
    """Records in, findings out: the one shape of every detector.

    ``observe`` judges one point (a :mod:`.points` record: the primary rank's
    :class:`~.points.Signal`, one rank's :class:`~.points.RankStep`, a
    :class:`~.points.SystemPoint` or the clock's :class:`~.points.Tick`) and appends
    to ``out`` what it found. It keeps its own state between calls, reads no clock
    and does no I/O, so the same object serves ``supervise``, ``run`` and ``analyze``.
    """

    reports: ClassVar[tuple[str, ...]]  # the anomaly kinds it may find
    # Optional (``needs``, read with getattr): what a training-signal point must have for this
    # detector to have anything to do with it, every item of (see NEEDS). The engine does not
    # show it the others (its observe would return at once): most steps of most runs are SFT
    # steps without extra fields, eval loss or time, and this runs at every one of them.
    # Optional too (``finish(out)``, read with getattr): the run is over; append what only its whole
    # length tells (``analyze`` calls it after the last record, the live engine when the run ends).

    def observe(self, point: P_contra, out: list[Finding]) -> None: ...


@dataclass(frozen=True)
class KindInfo:
    """Static facts about one anomaly kind: what it means, its likely cause and what to do."""

    title: str
    cause: str
    suggestion: str
    severity: Severity
    # A kind that is one face of a graver one: while an episode of ``part_of`` holds at the same rank
    # (or is raised at the same call), a firing of this kind is a part of it, not an episode of its own
    # (detect/episodes.py): a 120x gradient norm is a spike and an explosion, one trouble, one alert.
    part_of: str | None = None
    # What is left to people once steadytune took an action (policy's name) about it: the part of
    # ``suggestion`` that action does not already do. An action without an entry leaves ``suggestion``.
    after: dict[str, str] = field(default_factory=dict)
    # The cause in the words of a run whose facts are known (RUN_FACTS): the first fact of the run's
    # in this order replaces ``cause`` (no loss scaler to blame on a CPU or bf16 run, no NCCL on one
    # process). A fact nobody knows leaves ``cause``, which holds for any run.
    cause_on: dict[str, str] = field(default_factory=dict)
    # A state the run is in, not an event (detect/episodes.py): once raised, the condition firing again
    # however long it was quiet is the same episode. A model that memorised its data does not unlearn
    # it, and an eval loss back above its best is the same overfitting: a level that hovers about a
    # threshold must not make one episode (and one alert) per crossing.
    lasting: bool = False

    def cause_for(self, facts: frozenset[str]) -> str:
        """The cause as it reads for a run with ``facts``."""
        return next((c for fact, c in self.cause_on.items() if fact in facts), self.cause)


# What may be known of a run: where it trains (cpu, gpu), in which precision (fp16, bf16, fp32),
# and whether its ranks talk to each other (one_rank, ranks).
RUN_FACTS = frozenset({"cpu", "gpu", "fp16", "bf16", "fp32", "one_rank", "ranks"})


@dataclass(frozen=True, slots=True)
class Finding:
    """One condition at one step: ``active`` while it holds; ``evidence`` None keeps the last."""

    kind: str
    metric: str
    step: int
    active: bool
    rank: int | None = None
    severity: Severity | None = None
    evidence: dict[str, Any] | None = None
    cause: str | None = None  # replaces the kind's usual cause where a rule knows better
    suggestion: str | None = None  # and its usual fix (no GPU to look at on a CPU-only run)
    # Where one trouble shows on several metrics at once (a model's layers), the metric of the one
    # episode they make: the findings of a kind and rank with the same group are booked together
    # (detect/episodes.py). None: the finding's own metric is its episode's.
    group: str | None = None


# What ``needs`` may name, each a test of a :class:`~.points.Signal`: an objective other than the
# SFT loss rules' (RL, preference, a signed loss), extra fields on the record, an eval loss, a time.
NEEDS = ("own_objective", "extra", "eval_loss", "ts")


def rounded(x: float | None, digits: int = 6) -> float | None:
    """A float for evidence: finite and short, so the JSON stays readable."""
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


class Reporter:
    """Emits findings for one detector on one rank, and remembers what is active.

    It reports an active condition every time it holds (so the engine can move
    ``end_step``) but a cleared one only once.
    """

    __slots__ = ("on", "rank")

    def __init__(self, rank: int | None = None) -> None:
        self.rank = rank
        # (kind, metric) pairs now active; callers on a hot path test ``if rep.on`` before clearing.
        self.on: set[tuple[str, str]] = set()

    def is_on(self, kind: str, metric: str) -> bool:
        return (kind, metric) in self.on

    def end_all(self, out: list[Finding], step: int) -> None:
        """End every condition now active (the rules that raised them no longer apply to the run)."""
        for kind, metric in sorted(self.on):
            self.report(out, kind, metric, step, False)

    def report(
        self,
        out: list[Finding],
        kind: str,
        metric: str,
        step: int,
        active: bool,
        severity: Severity | None = None,
        evidence: dict[str, Any] | None = None,
        cause: str | None = None,
        suggestion: str | None = None,
        group: str | None = None,
    ) -> None:
        key = (kind, metric)
        if active:
            self.on.add(key)
            out.append(
                Finding(kind, metric, step, True, self.rank, severity, evidence, cause, suggestion, group)
            )
        elif key in self.on:
            self.on.discard(key)
            out.append(Finding(kind, metric, step, False, self.rank))

"""Findings become episodes: an anomaly that goes on or comes back is one episode, not one per point.

Detectors report a condition while it holds and once when it clears. The book
here turns that into episodes, one per kind, metric and rank:

- **raised**: the condition fired and no episode of it is open: a new episode
  (``count`` 1, ``start_step``, ``peak``);
- **escalated**: its severity rose (a warning that became critical), while it
  held or as it came back;
- **cleared**: the condition stopped holding. The episode stays open, quiet;
- **recurred**: the condition fired again while its episode was quiet, within
  ``episode_gap_points`` logging intervals of the last step it held at: the same
  episode, ``count`` + 1, its ``end_step`` and ``peak`` moved on;
- **resolved**: quiet for longer than the gap (or the run was rewound, or ended):
  the episode is over, with its final ``end_step``, ``count`` and ``peak``. A
  *lasting* kind (:attr:`~.base.KindInfo.lasting`: a memorising collapse, overfitting)
  is a state of the run, not an event: its quiet episode is resolved only by a rewind
  or the run's end, and its condition firing again at any later step recurs in it.

Why a gap, and why in logging intervals: a condition that comes back while the
detectors' level still holds the points from before it cleared (two level
windows, 16 logging intervals by default) is judged against the same baseline,
and is the same trouble: a logging artefact that prints a zero loss every tenth
line, a spike that recurs while the loss settles, a temperature hovering at its
limit. Counted in logging intervals (the primary rank's typical step between two
records), the gap means the same in a log written every step and one written
every 500, and a log of snippets with thousands of steps missing between them
keeps its far-apart events apart. A condition quiet for longer is judged against
a level that no longer holds it: a new episode.

``peak`` is the most extreme value the episode's evidence reported (its
``peak`` or ``value``): the highest, or for the kinds that fall (a collapse, a
vanishing gradient, a throughput drop, a reward collapse, low disk) the lowest;
``None`` where the kind's evidence names no single value.

**Groups.** One trouble may show on several metrics at once: an update that blows
up the gradient blows up several layers' (``grad_norm/embeddings``,
``grad_norm/layers.0``) with the model's (``grad_norm``). A detector that knows its
findings are parts of one thing names the episode they belong to
(:attr:`~.base.Finding.group`): the findings of a kind and rank with the same group
are one condition, judged together at each call. It holds while any member holds
(and clears when the last one does), fires with the worst member's evidence (the
most extreme ``value`` by the rule above) plus ``metrics`` (every member that held
during the episode, in the order they came) and ``worst`` (the member that was
worst at the latest firing), and is keyed, told and resolved as one episode on
the group's metric. A finding on the group's own metric (the model's ``grad_norm``
beside its layers') is one of its members. A member's clearing finding need not name
the group: the book remembers which episode each holding member belongs to.

**Parts.** Some kinds are one face of a graver one (:attr:`~.base.KindInfo.part_of`):
a gradient norm 120 times its level is a ``grad_spike`` and a ``grad_explosion`` at
once, and a NaN norm under a NaN loss is that loss's NaN seen from the backward
pass. Such a firing, while an episode of its whole is open at the same rank (holding,
or quiet within the gap: an explosion whose norm came down to a mere spike two points
later), or is raised by the same call, is part of that episode: no episode, transition
or alert of its own, from then until it clears. A part that fired first (a spike that
grows into an explosion a few points later) is the same trouble too: when the whole is
raised while the part's episode is still open (holding, or quiet within the gap), the
whole takes that episode over. It is told as the episode *escalated* (``took`` names
the part's episode it grew out of, whose key is gone), from the part's first step, with
the part's firings counted in, and the whole's firing for the policy to act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from steadytune.detect.base import Finding, KindInfo
from steadytune.records import SEVERITY_ORDER, Anomaly, Severity

State = Literal["raised", "escalated", "cleared", "recurred", "resolved"]
_METRICS = "metrics"  # a group's evidence: the members that held during its episode

# Kinds whose trouble is a value falling: their peak is the lowest value reported.
_FALLING = frozenset({"loss_collapse", "grad_vanishing", "throughput_drop", "reward_collapse", "disk_low"})

Key = tuple[str, str, int | None]  # an episode's kind, metric and rank (Anomaly.key)


@dataclass(frozen=True)
class Transition:
    """A change of an episode. ``anomaly`` is the episode as it stands.

    ``firing`` (for *recurred*, and *escalated* with ``took``) is the condition's new
    firing as an anomaly of its own, the way it would have been raised alone: what
    the policy acts on. ``was`` (for *escalated*) is the severity before. ``took``
    (for *escalated*): the episodes of parts a graver kind grew out of (the module
    docstring, *Parts*), as they stood; their keys are the episode's no more.
    """

    state: State
    anomaly: Anomaly
    firing: Anomaly | None = None
    was: Severity | None = None
    took: tuple[Anomaly, ...] = ()

    @property
    def fired(self) -> Anomaly:
        """The firing this transition is about: the new one for *recurred*, else the episode."""
        return self.firing if self.firing is not None else self.anomaly


def peak_of(kind: str, evidence: dict[str, Any] | None, peak: float | None) -> float | None:
    """``peak`` moved on by one finding's evidence (see the module docstring)."""
    if not evidence:
        return peak
    v = evidence.get("peak", evidence.get("value"))
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return peak
    if peak is None:
        return float(v)
    return float(min(peak, v) if kind in _FALLING else max(peak, v))


class _Episode:
    """One open episode; mutable so a long one costs nothing per point."""

    __slots__ = ("count", "end_step", "evidence", "first", "last_step", "peak", "quiet", "severity", "told")

    def __init__(self, first: Anomaly, step: int) -> None:
        self.first = first
        self.end_step = first.end_step
        self.severity: Severity = first.severity
        self.evidence: dict[str, Any] = dict(first.evidence)
        self.count = 1
        self.peak = first.peak
        self.quiet = False
        self.last_step = step  # the run's step when the condition last held
        self.told = False  # its end has been told already (Episodes.settle): it goes on without a word

    def snapshot(self) -> Anomaly:
        a = self.first
        return Anomaly(
            a.kind,
            self.severity,
            a.start_step,
            self.end_step,
            a.metric,
            dict(self.evidence),
            a.cause,
            a.suggestion,
            a.rank,
            self.count,
            self.peak,
        )


def _raises(ep: _Episode | None) -> bool:
    """Whether a condition firing with this episode open (or none) raises a new one."""
    return ep is None or (ep.told and ep.quiet)


def _grown(first: Anomaly, parts: list[_Episode], step: int) -> _Episode:
    """The episode of a whole raised as ``first`` that takes over its parts' open episodes: from the
    first part's start, their firings counted in, the worst of their peaks and severities."""
    ep = _Episode(first, step)
    ep.first = Anomaly(
        first.kind,
        first.severity,
        min(first.start_step, *(p.first.start_step for p in parts)),
        first.end_step,
        first.metric,
        first.evidence,
        first.cause,
        first.suggestion,
        first.rank,
    )
    ep.end_step = max(first.end_step, *(p.end_step for p in parts))
    ep.count += sum(p.count for p in parts)
    for p in parts:
        if p.peak is not None:
            ep.peak = peak_of(first.kind, {"value": p.peak}, ep.peak)
        if SEVERITY_ORDER[p.severity] > SEVERITY_ORDER[ep.severity]:
            ep.severity = p.severity
    return ep


class Episodes:
    """The open episodes of a run, by (kind, metric, rank); a group's metric for grouped findings.

    Args:
        kinds: the words of each kind (its usual severity, cause and fix).
        gap_points: logging intervals a condition may stay quiet and, firing again, be the same episode.
        disabled: kinds never reported.

    The caller passes the run's step and its logging interval with each call: the book
    keeps no clock of its own.
    """

    def __init__(self, kinds: dict[str, KindInfo], gap_points: int, disabled: frozenset[str]) -> None:
        self._kinds, self._gap, self._disabled = kinds, gap_points, disabled
        self._open: dict[Key, _Episode] = {}
        # How many open episodes are quiet and may expire (a lasting kind's never does): most points,
        # none are, and nothing expires.
        self._quiet = 0
        self._lasting = frozenset(kind for kind, info in kinds.items() if info.lasting)
        self._held: dict[Key, Key] = {}  # each grouped member now holding (kind, metric, rank) -> its group
        self._parts = {kind: info.part_of for kind, info in kinds.items() if info.part_of}
        self._wholes = frozenset(self._parts.values())
        self._within: set[Key] = set()  # conditions holding as parts of a graver episode (KindInfo.part_of)

    def apply(self, findings: list[Finding], step: int) -> list[Transition]:
        """The transitions the findings made when the run was at ``step`` make."""
        out: list[Transition] = []
        conditions = self._conditions(findings)
        if self._within or any(f.kind in self._parts and f.active for _, f in conditions):
            conditions = self._without_parts(conditions)
        for key, f in conditions:
            ep = self._open.get(key)
            if not f.active:
                if ep is not None and not ep.quiet:
                    ep.quiet = True
                    self._quiet += self._expires(ep)
                    if not ep.told:
                        out.append(Transition("cleared", ep.snapshot()))
                continue
            if ep is not None and ep.told and ep.quiet:
                # Back after its end was told: a new episode, not a recurrence of one people heard was over.
                del self._open[key]
                self._quiet -= self._expires(ep)
                ep = None
            if ep is None:
                first = self._firing(f)
                took = self._take_parts(f.kind, f.rank) if f.kind in self._wholes else []
                if took:
                    ep = self._open[key] = _grown(first, took, step)
                    was = max((p.severity for p in took), key=SEVERITY_ORDER.__getitem__)
                    parts = tuple(p.snapshot() for p in took)
                    out.append(Transition("escalated", ep.snapshot(), firing=first, was=was, took=parts))
                else:
                    self._open[key] = _Episode(first, step)
                    out.append(Transition("raised", first))
                continue
            was = ep.severity
            ep.end_step = max(ep.end_step, f.step)
            ep.last_step = step
            if f.evidence:
                members = ep.evidence.get(_METRICS)
                ep.evidence.update(f.evidence)
                if f.group is not None and isinstance(members, list):
                    # Every member the episode held on, not only this firing's.
                    ep.evidence[_METRICS] = list(dict.fromkeys([*members, *f.evidence[_METRICS]]))
                ep.peak = peak_of(f.kind, f.evidence, ep.peak)
            if f.severity and SEVERITY_ORDER[f.severity] > SEVERITY_ORDER[ep.severity]:
                ep.severity = f.severity
            if ep.quiet:
                ep.quiet = False
                self._quiet -= self._expires(ep)
                ep.count += 1
                firing = self._firing(f)
                if SEVERITY_ORDER[firing.severity] > SEVERITY_ORDER[ep.severity]:
                    ep.severity = firing.severity
                out.append(Transition("recurred", ep.snapshot(), firing=firing))
            if ep.severity != was and not ep.told:
                out.append(Transition("escalated", ep.snapshot(), was=was))
        return out

    def _conditions(self, findings: list[Finding]) -> list[tuple[Key, Finding]]:
        """Each condition the findings report, with its episode's key: a finding is its own condition, the
        findings of one group are one (the module docstring), in the order the first of each came."""
        if not self._held and all(f.group is None for f in findings):  # most calls: no group at all
            return [((f.kind, f.metric, f.rank), f) for f in findings if f.kind not in self._disabled]
        order: list[tuple[Key, Finding | None]] = []  # None: a group's place, its finding made below
        grouped: dict[Key, list[Finding]] = {}
        # A finding on a group's own metric (the model's grad_norm beside its layers') is one of its members.
        groups = {(f.kind, f.group, f.rank) for f in findings if f.group is not None} | set(
            self._held.values()
        )
        for f in findings:
            if f.kind in self._disabled:
                continue
            member = (f.kind, f.metric, f.rank)
            group = (
                (f.kind, f.group, f.rank)
                if f.group is not None
                else self._held.get(member, member if member in groups else None)
            )
            if group is None:
                order.append((member, f))
            elif group in grouped:
                grouped[group].append(f)
            else:
                grouped[group] = [f]
                order.append((group, None))
        out: list[tuple[Key, Finding]] = []
        for key, alone in order:
            joined = alone if alone is not None else self._joined(key, grouped[key])
            if joined is not None:
                out.append((key, joined))
        return out

    def _without_parts(self, conditions: list[tuple[Key, Finding]]) -> list[tuple[Key, Finding]]:
        """The conditions less those that are parts of a graver episode (the module docstring, *Parts*).

        A part is taken in when it fires while its whole's episode is open at the same rank (holding,
        or quiet within the gap and not told over) or fires in this same call, and it has no episode
        of its own holding, or its whole is raised in this call (which takes that episode over, see
        :meth:`apply`); it stays a part, told by nothing, until it clears, even if the whole clears
        first (a NaN norm's episode outlasts the NaN loss's by a few finite points: it is still that
        one trouble).
        """
        firing = {(f.kind, f.rank) for _, f in conditions if f.active}
        # A whole raised now (no episode of its own holding): it takes over its parts' open episodes.
        raising = {
            (f.kind, f.rank)
            for key, f in conditions
            if f.active and f.kind in self._wholes and _raises(self._open.get(key))
        }
        open_ = {(ep.first.kind, ep.first.rank) for ep in self._open.values() if not (ep.quiet and ep.told)}
        kept: list[tuple[Key, Finding]] = []
        for key, f in conditions:
            if not f.active:
                if key in self._within:
                    self._within.discard(key)
                    continue
            elif key in self._within:
                continue
            else:
                whole = self._parts.get(f.kind)
                if whole is not None and ((whole, f.rank) in firing or (whole, f.rank) in open_):
                    own = self._open.get(key)
                    if own is None or own.quiet or (whole, f.rank) in raising:
                        self._within.add(key)
                        continue
            kept.append((key, f))
        return kept

    def _take_parts(self, whole: str, rank: int | None) -> list[_Episode]:
        """The open episodes of ``whole``'s parts at ``rank``, out of the book: a whole raised now
        takes them over. Those told over already go in silence (their end was told)."""
        took: list[_Episode] = []
        for key, ep in list(self._open.items()):
            if self._parts.get(ep.first.kind) == whole and ep.first.rank == rank:
                del self._open[key]
                if ep.quiet:
                    self._quiet -= self._expires(ep)
                if not ep.told:
                    took.append(ep)
        return took

    def _joined(self, key: Key, members: list[Finding]) -> Finding | None:
        """One group's findings of one call as the group's own: active while any member holds, inactive
        when the last one stopped, None when members cleared while others still hold."""
        for f in members:
            if f.active:
                self._held[(f.kind, f.metric, f.rank)] = key
            else:
                self._held.pop((f.kind, f.metric, f.rank), None)
        kind, metric, rank = key
        holding = [f for f in members if f.active]
        if not holding:
            if key in self._held.values():
                return None
            return Finding(kind, metric, members[-1].step, False, rank, group=metric)
        falling = kind in _FALLING
        worst, worst_v = holding[0], peak_of(kind, holding[0].evidence, None)
        for f in holding[1:]:
            v = peak_of(kind, f.evidence, None)
            if v is not None and (worst_v is None or (v < worst_v if falling else v > worst_v)):
                worst, worst_v = f, v
        info = self._kinds[kind]
        severity = max((f.severity or info.severity for f in holding), key=SEVERITY_ORDER.__getitem__)
        names = [f.metric for f in holding]
        evidence = {**(worst.evidence or {}), _METRICS: names, "worst": worst.metric}
        cause = worst.cause or info.cause
        if len(names) > 1:
            shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
            cause = f"{cause} ({len(names)} at once: {shown})"
        step = max(f.step for f in holding)
        return Finding(kind, metric, step, True, rank, severity, evidence, cause, worst.suggestion, metric)

    def settle(self) -> None:
        """The open episodes' ends have been told: from now on they go on without a word.

        After a rewind, the episodes a replay rebuilt up to the resume step were each raised on the
        run's timeline and since resolved there, or resolved as cleared by the rewind itself. Told
        once, they must not be resolved (or cleared, or escalated) a second time: each stays open
        only so that its condition holding on is not a new episode (nor a new firing for the policy),
        and ends in silence. Once quiet, a firing is a new episode, raised."""
        for ep in self._open.values():
            ep.told = True

    def _expires(self, ep: _Episode) -> int:
        """1 when ``ep`` may expire once quiet, 0 for a lasting kind's: what the quiet count counts."""
        return 0 if ep.first.kind in self._lasting else 1

    @property
    def quiet(self) -> int:
        """How many open episodes are quiet and may expire (a lasting kind's waits for the run's end)."""
        return self._quiet

    def expire(self, step: int, interval: float, ending: bool = False) -> list[Transition]:
        """Resolve the episodes quiet longer than the gap: the run is at ``step``, logs every ``interval``.
        ``ending``: the run is over, and a lasting kind's quiet episode ends too."""
        out = []
        limit = self._gap * interval
        for key, ep in list(self._open.items()):
            expires = self._expires(ep)
            if ep.quiet and step - ep.last_step > limit and (ending or expires):
                del self._open[key]
                self._quiet -= expires
                if not ep.told:
                    out.append(Transition("resolved", ep.snapshot()))
        return out

    def close(self) -> list[Transition]:
        """The run ended: resolve the quiet episodes (those still holding stay open, as they are)."""
        return self.expire(2**62, 1.0, ending=True)

    def open(self) -> list[Anomaly]:
        """Every episode not yet resolved, quiet ones included, as it stands now (not those told over)."""
        return [ep.snapshot() for ep in self._open.values() if not ep.told]

    def _firing(self, f: Finding) -> Anomaly:
        """A finding as an anomaly of its own: the episode's first firing, or a new one of it."""
        info = self._kinds[f.kind]
        evidence = dict(f.evidence or {})
        return Anomaly(
            f.kind,
            f.severity or info.severity,
            f.step,
            f.step,
            f.metric,
            evidence,
            f.cause or info.cause,
            f.suggestion or info.suggestion,
            f.rank,
            1,
            peak_of(f.kind, evidence, None),
        )

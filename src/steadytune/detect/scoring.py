"""Scoring detections against labelled logs (LABELS.tsv), for the benchmark and the tests.

A label row names a file, its class (positive / negative / ambiguous), and for
a positive one the group of the anomaly and its step range. A positive row is
*caught* by a warning/critical alarm of a compatible kind that fires inside
the range widened by two logging intervals; an alarm spanning the whole file
catches nothing (unless the range itself is the whole file). Any warning or
critical alarm on a negative file, or on a positive file away from its
ranges, is a false alarm. Ambiguous files prove nothing either way.

The groups and what each accepts are those of the labelling rules the real-log
sets are labelled by (``benchmarks/corpus/README.md``). Precision is counted by
episode: each raised alarm is one, whether it caught a label, was a false
alarm, or fell inside a window without being of a kind that window accepts
(then it is neither).

steadytune's alarms are episodes (detect/episodes.py): an episode is one false alarm
however often its condition came back, and it catches a range when it began there or
came back there (``firings``: the live engine acted on each firing, and analyze lists
the episode with its count and end).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

# Label groups -> the anomaly kinds that count as detecting them.
GROUP_KINDS: dict[str, frozenset[str]] = {
    "divergence": frozenset({"divergence", "loss_spike", "kl_blowup"}),
    "collapse": frozenset({"loss_collapse", "reward_collapse"}),
    "plateau": frozenset({"plateau", "grad_vanishing", "no_learning_signal"}),
    "nan": frozenset({"nan_loss", "nonfinite_grad", "nan_eval"}),
    "spike": frozenset({"loss_spike", "divergence", "grad_spike", "grad_explosion"}),
    "grad_spike": frozenset({"grad_spike", "grad_explosion"}),
    "overfit": frozenset({"overfitting"}),
}


@dataclass(frozen=True)
class Label:
    file: str
    cls: str
    group: str
    start: int
    end: int


@dataclass(frozen=True)
class Alarm:
    """Any detector's alarm: ``kind`` None for detectors that name no kind (any counts).

    ``firings``: the steps an episode's condition fired at (its start, then each time it came
    back); empty for an alarm that is a single firing.
    """

    kind: str | None
    severity: str
    start: int
    end: int
    raised: int | None = None  # the step at which it was raised (None: at its start)
    firings: tuple[int, ...] = ()


@dataclass
class FileScore:
    positives: int = 0
    caught: int = 0
    false_alarms: int = 0
    healthy_steps: int = 0
    alarms: int = 0
    true_alarms: int = 0  # alarms that caught a label (precision's numerator)
    delays: list[float] = field(default_factory=list)  # per caught label, in logging intervals

    def add(self, other: FileScore) -> None:
        self.positives += other.positives
        self.caught += other.caught
        self.false_alarms += other.false_alarms
        self.healthy_steps += other.healthy_steps
        self.alarms += other.alarms
        self.true_alarms += other.true_alarms
        self.delays.extend(other.delays)


def read_labels(path: Path) -> dict[str, list[Label]]:
    """LABELS.tsv rows grouped by file."""
    out: dict[str, list[Label]] = {}
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    for line in lines[1:]:
        if not line.strip():
            continue
        row = dict(zip(header, line.split("\t"), strict=False))
        start = int(row["start"]) if row.get("start", "-").lstrip("-").isdigit() else 0
        end = int(row["end"]) if row.get("end", "-").lstrip("-").isdigit() else 0
        out.setdefault(row["file"], []).append(
            Label(row["file"], row["class"], row.get("group", "-"), start, end)
        )
    return out


def logging_interval(steps: list[int]) -> int:
    gaps = sorted(b - a for a, b in pairwise(sorted(set(steps))))
    return gaps[len(gaps) // 2] if gaps else 1


def _fired_in(alarm: Alarm, lo: int, hi: int) -> bool:
    """An episode catches a range where it began or came back."""
    return any(lo <= s <= hi for s in alarm.firings or (alarm.start,))


def _raised_at(alarm: Alarm, lo: int, hi: int) -> int:
    """The step at which the episode was raised in ``lo..hi``: where it was raised, or came back."""
    if lo <= alarm.start <= hi:
        return alarm.start if alarm.raised is None else alarm.raised
    return min((s for s in alarm.firings if lo <= s <= hi), default=alarm.start)


def score_file(labels: list[Label], steps: list[int], alarms: list[Alarm]) -> FileScore:
    """How one detector did on one labelled file."""
    steps = sorted(set(steps))
    alarms = [a for a in alarms if a.severity in ("warning", "critical")]
    score = FileScore(alarms=len(alarms))
    cls = labels[0].cls
    if cls == "ambiguous" or not steps:
        return score
    iv = logging_interval(steps)
    positives = [lb for lb in labels if lb.cls == "positive"]
    windows = [(lb.start - 2 * iv, lb.end + 2 * iv) for lb in positives]
    score.positives = len(positives)
    score.healthy_steps = sum(1 for s in steps if not any(lo <= s <= hi for lo, hi in windows))
    score.false_alarms = sum(1 for a in alarms if not any(lo <= a.start <= hi for lo, hi in windows))
    true: set[int] = set()
    for lb, (lo, hi) in zip(positives, windows, strict=True):
        whole_label = lb.start <= steps[0] and lb.end >= steps[-1]
        accepts = GROUP_KINDS.get(lb.group, frozenset())
        hits = [
            i
            for i, a in enumerate(alarms)
            if _fired_in(a, lo, hi)
            and not (a.start <= steps[0] and a.end >= steps[-1] and not whole_label)
            and (a.kind is None or a.kind in accepts)
        ]
        if hits:
            score.caught += 1
            true.update(hits)
            raised = min(_raised_at(alarms[i], lo, hi) for i in hits)
            score.delays.append(max(0.0, (raised - lb.start) / iv))
    score.true_alarms = len(true)
    return score

"""Robustness of the verdicts on the real logs to how a run happens to be logged.

    python benchmarks/detection_robustness.py [--only NAME ...] [--detail]

Each labelled real log (the same set and loaders as ``benchmarks/detection.py``)
is re-read and then perturbed in ways that must not change a careful engineer's
verdict, and every detector set is scored on the result with its shipped
defaults (steadytune's thresholds are the ones chosen a priori or leave-one-out,
not re-tuned per perturbation; the baselines' are their published rules):

- ``every 2nd / 5th / 10th``: only every k-th logged point kept (a coarser
  ``logging_steps`` of a logger that prints the step it is at);
- ``mean of 2 / 5 / 10``: each block of k logged points replaced by one point at the block's
  last step holding the mean of their losses and grad norms, over every phase of the blocks (a
  coarser ``logging_steps`` of a logger that averages since its last line: HF Trainer,
  Megatron, llm.c); evaluation rows pass through;
- ``first 25 / 50 / 75 %``: the run cut short after that share of its points;
- ``loss x0.5 / x3``: train and eval loss scaled (another tokenizer or a summed
  objective; ratios must not care);
- ``no eval``: evaluation rows removed; ``no grad norm``: the grad norm not logged;
- ``jittered steps``: every interval between logged steps stretched or shrunk by a
  seeded factor in [0.5, 1.5] (an irregular logger); labels move with them;
- ``gappy log``: stretches of 8-30 points missing, one starting at about every 50th point
  (lines lost, a logger that was down).

A labelled anomaly counts only while its evidence is still in the perturbed log:
for a spike, a grad spike or a NaN, its point (the highest loss or grad norm in the
range, or a non-finite one) must be kept; for a span (divergence, collapse, plateau)
two of its points must be. After averaging, a point is kept by the block it fell in (a
non-finite value makes its block's mean non-finite, as a logger's running sum does), and a
spike also needs its block to stand above the level before it (the median of the up to
three blocks before it in its stretch) by the smallest jump the shipped rules call a spike
(``loss.spike_min_ratio``, ``grad.spike_min_ratio``): a one-batch jump averaged over k points
is 1/k of itself, and what no longer stands out of its neighbours is a spike to no one.
Labels whose evidence was dropped are neither caught nor missed. False alarms are counted
as in ``detection.py``: any warning or critical alarm on a healthy file or away from a
positive file's ranges.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import itertools
import math
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic_baselines import BASELINES, baseline_alarms, records_events
from detection import OURS, SETS, _ours, real_logs_dir

from steadytune.detect import DetectConfig
from steadytune.detect.scoring import Alarm, FileScore, Label, logging_interval, read_labels, score_file
from steadytune.importers import UnreadableLog, load
from steadytune.records import StepRecord

# (original step, perturbed record): the original step ties each kept point to the labels.
Kept = list[tuple[int, StepRecord]]
# Each perturbation gives one or more variants of a log (every phase of a decimation, several seeds).
Perturbation = Callable[[list[StepRecord]], list[Kept]]

JITTER_SEEDS = (17, 18, 19)
CHANGES = {"spike", "grad_spike", "divergence", "collapse"}  # label groups measured from a level before
AVERAGED = {"mean of 2", "mean of 5", "mean of 10"}  # each kept point stands for its block


def _same(recs: list[StepRecord]) -> list[Kept]:
    return [[(r.step, r) for r in recs]]


def _logged_steps(recs: list[StepRecord]) -> list[int]:
    return sorted({r.step for r in recs})


def decimate(k: int) -> Perturbation:
    def run(recs: list[StepRecord]) -> list[Kept]:
        steps = _logged_steps(recs)
        out = []
        for phase in range(k):  # which points a coarser logger keeps is chance: every phase counts
            keep = set(steps[phase::k])
            out.append([(r.step, r) for r in recs if r.step in keep])
        return out

    return run


def _mean(values: list[float | None]) -> float | None:
    logged = [x for x in values if x is not None]
    # A running sum, as loggers keep it: one NaN or Inf in the block makes the logged mean one.
    return sum(logged) / len(logged) if logged else None


def _trains(r: StepRecord) -> bool:
    return r.loss is not None or r.grad_norm is not None


def average(k: int) -> Perturbation:
    def run(recs: list[StepRecord]) -> list[Kept]:
        steps = sorted({r.step for r in recs if _trains(r)})
        evals = [(r.step, r) for r in recs if not _trains(r)]
        out = []
        for phase in range(k):  # where the logger's blocks begin is chance: every phase counts
            cuts = [0, *range(phase or k, len(steps), k), len(steps)]
            block_of = {s: steps[b - 1] for a, b in itertools.pairwise(cuts) for s in steps[a:b]}
            members: dict[tuple[int, int], list[StepRecord]] = {}
            for r in recs:
                if _trains(r):
                    members.setdefault((block_of[r.step], r.rank), []).append(r)
            kept: Kept = list(evals)
            for (last, _rank), rs in members.items():
                evaluated = [r.eval_loss for r in rs if r.eval_loss is not None]
                mean = dataclasses.replace(
                    rs[-1],
                    loss=_mean([r.loss for r in rs]),
                    grad_norm=_mean([r.grad_norm for r in rs]),
                    eval_loss=evaluated[-1] if evaluated else None,
                )
                kept.append((last, mean))
            out.append(sorted(kept, key=lambda kr: (kr[1].step, kr[1].rank)))
        return out

    return run


def truncate(share: float) -> Perturbation:
    def run(recs: list[StepRecord]) -> list[Kept]:
        steps = _logged_steps(recs)
        cut = steps[max(0, math.ceil(share * len(steps)) - 1)] if steps else 0
        return [[(r.step, r) for r in recs if r.step <= cut]]

    return run


def _scale(x: float | None, factor: float) -> float | None:
    return None if x is None else x * factor


def scale_loss(f: float) -> Perturbation:
    def run(recs: list[StepRecord]) -> list[Kept]:
        return [
            [
                (
                    r.step,
                    dataclasses.replace(r, loss=_scale(r.loss, f), eval_loss=_scale(r.eval_loss, f)),
                )
                for r in recs
            ]
        ]

    return run


def no_eval(recs: list[StepRecord]) -> list[Kept]:
    out: Kept = []
    for r in recs:
        if r.eval_loss is None:
            out.append((r.step, r))
        elif r.loss is not None or r.grad_norm is not None:
            out.append((r.step, dataclasses.replace(r, eval_loss=None)))
    return [out]


def no_grad(recs: list[StepRecord]) -> list[Kept]:
    return [[(r.step, dataclasses.replace(r, grad_norm=None)) for r in recs]]


def jitter(recs: list[StepRecord]) -> list[Kept]:
    steps = _logged_steps(recs)
    out = []
    for seed in JITTER_SEEDS:
        rng = random.Random(seed)
        new = {steps[0]: steps[0]} if steps else {}
        for a, b in itertools.pairwise(steps):
            new[b] = new[a] + max(1, round((b - a) * rng.uniform(0.5, 1.5)))
        out.append([(r.step, dataclasses.replace(r, step=new[r.step])) for r in recs])
    return out


def gaps(recs: list[StepRecord]) -> list[Kept]:
    """Stretches of 8-30 logged points missing, one starting at about every 50th point (lost lines)."""
    steps = _logged_steps(recs)
    out = []
    for seed in JITTER_SEEDS:
        rng = random.Random(seed)
        drop: set[int] = set()
        i = 0
        while i < len(steps):
            if i and rng.random() < 0.02:
                n = rng.randint(8, 30)
                drop.update(steps[i : i + n])
                i += n
            i += 1
        out.append([(r.step, r) for r in recs if r.step not in drop])
    return out


PERTURBATIONS: dict[str, Perturbation] = {
    "as logged": _same,
    "every 2nd point": decimate(2),
    "every 5th point": decimate(5),
    "every 10th point": decimate(10),
    "mean of 2": average(2),
    "mean of 5": average(5),
    "mean of 10": average(10),
    "first 25 %": truncate(0.25),
    "first 50 %": truncate(0.50),
    "first 75 %": truncate(0.75),
    "loss x0.5": scale_loss(0.5),
    "loss x3": scale_loss(3.0),
    "no eval": no_eval,
    "no grad norm": no_grad,
    "jittered steps": jitter,
    "gappy log": gaps,
}


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _nonfinite(r: StepRecord) -> bool:
    return any(x is not None and not math.isfinite(x) for x in (r.loss, r.grad_norm))


def _evidence(label: Label, original: list[StepRecord]) -> tuple[set[int], int]:
    """The original steps a label's verdict rests on, and how many of them must be kept."""
    inside = [r for r in original if label.start <= r.step <= label.end]
    if label.group == "nan":
        return {r.step for r in inside if _nonfinite(r)}, 1
    if label.group in ("spike", "grad_spike"):
        field = "loss" if label.group == "spike" else "grad_norm"
        values = [(getattr(r, field), r.step) for r in inside if _finite(getattr(r, field))]
        return ({max(values)[1]} if values else set()), 1
    steps = {r.step for r in inside if r.loss is not None}
    return steps, min(2, len(steps))


def _holds(label: Label, r: StepRecord) -> bool:
    if label.group == "nan":
        return _nonfinite(r)
    return (r.grad_norm if label.group == "grad_spike" else r.loss) is not None


def _snippet_start(steps: list[int], step: int, gap: float) -> int:
    """The first step of the stretch of the log that holds ``step``: gaps as the detectors see them."""
    i = bisect.bisect_right(steps, step) - 1
    while i > 0 and steps[i] - steps[i - 1] <= gap:
        i -= 1
    return steps[max(i, 0)]


def _blocks(original: list[StepRecord], kept: Kept) -> dict[int, int]:
    """Each original training step mapped to the kept step that stands for it: its averaged block."""
    ends = sorted({o for o, r in kept if _trains(r)})
    trained = {r.step for r in original if _trains(r)}
    return {s: ends[bisect.bisect_left(ends, s)] for s in trained if ends and s <= ends[-1]}


LEVEL_BLOCKS = 3  # the blocks before an averaged spike that stand for the level it jumped from


def _stands_out(label: Label, block: StepRecord, before: list[StepRecord]) -> bool:
    """Whether an averaged spike's block still rises above the level before it by a spike's jump.

    The level is the median of up to LEVEL_BLOCKS blocks before it in the same stretch: one low
    block before it must not make a wiggle a jump.
    """
    field = "loss" if label.group == "spike" else "grad_norm"
    cfg = DetectConfig()
    floor = cfg.loss.spike_min_ratio if label.group == "spike" else cfg.grad.spike_min_ratio
    up = getattr(block, field)
    levels = [x for x in (getattr(r, field) for r in before[-LEVEL_BLOCKS:]) if _finite(x)]
    if not _finite(up) or not levels:
        return False
    base = statistics.median(levels)
    return base > 0 and up >= floor * base


def surviving(
    labels: list[Label], original: list[StepRecord], kept: Kept, averaged: bool = False
) -> tuple[list[Label], list[Label]]:
    """The labels whose evidence the perturbed log still holds, and those it lost, moved to its steps.

    A jump, a climb or a fall is a change from somewhere: when the log held a point
    before its evidence in the same stretch (not across a gap), the level it is
    measured from, the perturbed log must keep one there too (a log or a snippet that
    begins with the loss already up shows no spike). ``averaged``: each kept point is the
    mean of a block of original points, ending at its step; a point is kept by its block.
    """
    if labels[0].cls != "positive":
        return labels, []
    by_step = {o: r for o, r in kept}
    old = sorted(by_step)
    new = [by_step[o].step for o in old]
    steps = sorted({r.step for r in original})
    gap = DetectConfig().series.gap_factor * logging_interval(steps)
    home = _blocks(original, kept) if averaged else {}
    kept_out: list[Label] = []
    lost: list[Label] = []
    for lb in labels:
        need, count = _evidence(lb, original)
        if averaged:
            need = {home[s] for s in need if s in home}
            count = min(count, len(need))
        have = sorted(s for s in need if s in by_step and _holds(lb, by_step[s]))
        ok = bool(need) and len(have) >= count
        if ok and lb.group in CHANGES:
            start = _snippet_start(steps, min(need), gap)
            if start < min(need):  # the log held a level before the evidence: keep one
                i = bisect.bisect_left(old, start)
                ok = i < len(old) and old[i] < have[0]
                if ok and averaged and lb.group in ("spike", "grad_spike"):
                    before = [by_step[o] for o in old[i:] if o < have[0] and _trains(by_step[o])]
                    ok = _stands_out(lb, by_step[have[0]], before)
        label = dataclasses.replace(lb, start=_move(lb.start, old, new), end=_move(lb.end, old, new))
        (kept_out if ok else lost).append(label)
    return kept_out, lost


def _move(step: int, old: list[int], new: list[int]) -> int:
    """A label boundary carried along with the logged steps (only jitter moves them)."""
    i = bisect.bisect_right(old, step)
    if i == 0 or i == len(old):
        return step - old[0] + new[0] if i == 0 else step - old[-1] + new[-1]
    o1, o2, n1, n2 = old[i - 1], old[i], new[i - 1], new[i]
    return n1 + round((step - o1) * (n2 - n1) / (o2 - o1))


def _alarms(records: list[StepRecord], system: list[Any]) -> dict[str, list[Alarm]]:
    res = {OURS: _ours(SimpleNamespace(records=records, system=system))}
    events = records_events(records)
    for cls in BASELINES:
        res[cls.name] = [Alarm(None, sev, st, st) for _k, sev, st in baseline_alarms(cls, events)]
    return res


def _outside(alarms: list[Alarm], lost: list[Label], interval: int) -> list[Alarm]:
    """Alarms away from the labels whose evidence was dropped: those are neither a catch nor false."""
    return [
        a
        for a in alarms
        if not any(lb.start - 2 * interval <= a.start <= lb.end + 2 * interval for lb in lost)
    ]


def run(root: Path, names: list[str], detail: bool) -> None:
    labels = read_labels(root / "LABELS.tsv")
    loaded = {}
    for file, rows in sorted(labels.items()):
        if rows[0].cls == "ambiguous":
            continue
        try:
            loaded[file] = load(root / file)
        except UnreadableLog as e:
            print(f"  {file}: UNREADABLE ({e})")
    print(
        f"robustness of the verdicts on {len(loaded)} labelled real logs ({root}), shipped defaults:\n"
        "caught / labels whose evidence the perturbed log keeps, false alarms (of them on healthy files), "
        "summed over every variant (decimation phases, jitter seeds)"
    )
    print(f"{'':18s}" + "".join(f"{n[:20]:>22s}" for n in SETS))
    for name in names:
        total = {n: FileScore() for n in SETS}
        healthy_fa = dict.fromkeys(SETS, 0)
        notes: list[str] = []
        for file, series in loaded.items():
            for v, kept in enumerate(PERTURBATIONS[name](series.records)):
                recs = [r for _o, r in kept]
                if not recs:
                    continue
                rows, lost = surviving(labels[file], series.records, kept, name in AVERAGED)
                # A positive file whose every anomaly was cut away still counts for false alarms.
                rows = rows or [Label(file, "negative", "-", 0, 0)]
                steps = [r.step for r in recs]
                iv = logging_interval(steps)
                res = _alarms(recs, series.system)
                for n in SETS:
                    sc = score_file(rows, steps, _outside(res[n], lost, iv))
                    for f in ("positives", "caught", "false_alarms", "healthy_steps"):
                        setattr(total[n], f, getattr(total[n], f) + getattr(sc, f))
                    if labels[file][0].cls == "negative":
                        healthy_fa[n] += sc.false_alarms
                    if n == OURS and detail and (sc.caught < sc.positives or sc.false_alarms):
                        found = [(a.kind, a.start) for a in res[n] if a.severity != "info"]
                        notes.append(
                            f"    {file[:40]} #{v}: {sc.caught}/{sc.positives} caught, "
                            f"{sc.false_alarms} FA {found[:6]}"
                        )
        cells = [f"{t.caught}/{t.positives}, {t.false_alarms} ({healthy_fa[n]})" for n, t in total.items()]
        print(f"{name:18s}" + "".join(f"{c:>22s}" for c in cells))
        if notes:
            print("\n".join(notes))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=list(PERTURBATIONS), help="perturbations to run")
    ap.add_argument("--detail", action="store_true", help="steadytune's misses and false alarms per file")
    args = ap.parse_args()
    root = real_logs_dir()
    assert root is not None
    run(root, args.only or list(PERTURBATIONS), args.detail)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Detection benchmark: steadytune's detectors side by side with published baselines.

    python benchmarks/detection.py [--quick] [--seed N] [--seeds N] [--per-kind N] [--real-only]

For each detector set (steadytune, llm-foundry KillLossSpike, OLMo-core 6σ,
Megatron 10x, naive thresholds; see _synthetic_baselines.py for their rules):

(a) synthetic suite (steadytune.detect.synthetic / .faults), over several seeds,
    each figure with its range: healthy runs of 14 shapes, and runs with each of
    20 anomaly kinds injected at a known point. A catch is an alarm that begins
    within the injected range +- 2 logging intervals AND is raised within K
    logged points of the injection (K = 5 after the evidence the rule needs by
    definition; printed per kind). For steadytune it must be of a kind in
    faults.ACCEPT; baselines name no kind, so any alarm counts. False alarms
    (warning/critical) are counted per 10,000 healthy logged steps: on the
    healthy runs and on each faulty run before its injection. In fp16-skip
    runs, a *warning* on a skipped step is the expected outcome. steadytune's
    alarms are episodes (one however often the condition comes back: one false
    alarm), and catch where any of their firings is; a baseline's run of
    consecutive flagged points is one alarm.
(b) real logs (../shared/data/real-logs, $STEADYTUNE_REAL_LOGS, or the copy
    vendored under tests/assets), scored against LABELS.tsv, in-sample and
    LEAVE-ONE-FILE-OUT: the thresholds in TUNED are chosen for each file on the
    other files, and that file is scored with the choice. Quote the
    leave-one-out figure; the in-sample one is printed beside it. A positive row
    is caught by an alarm of a compatible kind beginning inside its range +- 2
    logging intervals (one spanning the whole file does not count); any
    warning/critical alarm on a negative file, or on a positive file away from
    its ranges, is a false alarm. Ambiguous files prove nothing.
(c) spike-size sweep: recall of one injected loss spike by its size in noise
    sigmas, to show where each rule's sensitivity ends.
(d) speed: live cost per step, and analyze on a 100,000-step trainer_state.json
    in process and as a new process.

Targets: leave-one-out recall >= 90% with <= 1 false alarm on the healthy real
files; synthetic recall >= 0.95 per kind within K and <= 1 false alarm per
10,000 healthy steps; analyze 100k steps < 2 s as a new process, live < 1 ms/step.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic_baselines import BASELINES, baseline_alarms, records_events

from steadytune.detect import LiveDetector, detect
from steadytune.detect.faults import ACCEPT, FAULT_KINDS, Fault, fault_runs
from steadytune.detect.offline import replay_runs
from steadytune.detect.scoring import Alarm as ScoredAlarm
from steadytune.detect.scoring import FileScore, read_labels, score_file
from steadytune.detect.synthetic import HEALTHY_SHAPES, Run, base_run, healthy_runs, to_events
from steadytune.importers import UnreadableLog, load

OURS = "steadytune"
# kind (None: a baseline names none), severity, start step, raised at, and whether it is a firing of an
# episode already raised (steadytune's recurrences: a catch where it fires, never a second false alarm)
Alarm = tuple[str | None, str, int, int, bool]
SETS = [OURS] + [b.name for b in BASELINES]


def our_alarms(events: list[tuple[str, Any]]) -> list[Alarm]:
    """steadytune's episodes as they were raised, and each time one fired again (``again``)."""
    det = LiveDetector()
    out: list[Alarm] = []
    for kind, item in events:
        if kind == "step":
            ts, at = det.observe_step(item), item.step
        elif kind == "system":
            ts, at = det.observe_system(item), det.last_step
        else:
            ts, at = det.observe_time(*item), det.last_step
        out.extend(
            (t.fired.kind, t.fired.severity, t.fired.start_step, at, t.state == "recurred")
            for t in ts
            if t.state in ("raised", "recurred")
        )
    return out


def all_alarms(events: list[tuple[str, Any]]) -> dict[str, list[Alarm]]:
    res = {OURS: our_alarms(events)}
    for cls in BASELINES:
        res[cls.name] = [(k, sev, st, st, False) for k, sev, st in baseline_alarms(cls, events)]
    return res


def _index(run: Run, step: int) -> int:
    return min(max(0, bisect.bisect_left(run.steps, step)), run.n - 1)


class Tally:
    """Counts for one detector set over the synthetic suite."""

    def __init__(self) -> None:
        self.fa = 0
        self.fa_kinds: Counter[str] = Counter()
        self.healthy_points = 0
        self.hits: Counter[str] = Counter()
        self.tries: Counter[str] = Counter()
        self.delays: dict[str, list[int]] = defaultdict(list)
        self.leak_ok = 0

    def false_alarms(self, run: Run, alarms: list[Alarm], before: int | None = None) -> None:
        for kind, severity, step, _at, again in alarms:
            if again or severity == "info" or (before is not None and step >= before):
                continue
            skipped_step = _index(run, step) in run.skipped
            if run.shape == "fp16_skips" and skipped_step and severity == "warning":
                continue
            self.fa += 1
            self.fa_kinds[kind or "alarm"] += 1

    def fault(self, f: Fault, alarms: list[Alarm], ours: bool, within: int = 5) -> None:
        run, iv = f.run, f.run.interval
        lo, hi = run.steps[f.start] - 2 * iv, run.steps[f.end] + 2 * iv
        self.tries[f.kind] += 1
        self.healthy_points += f.start
        self.false_alarms(run, alarms, before=lo)
        for kind, severity, step, at, _again in alarms:
            if severity == "info" or not lo <= step <= hi:
                continue
            if ours and kind not in ACCEPT[f.kind]:
                continue
            i = _index(run, at)  # delay: from the injection to the point that raised the alarm
            if i - f.start > within:
                continue  # raised too late to act on: not a detection
            self.hits[f.kind] += 1
            self.delays[f.kind].append(max(0, i - f.start))
            if f.kind == "memory_leak" and f.oom_bytes is not None and (run.mem_alloc[i] or 0) <= f.oom_bytes:
                self.leak_ok += 1
            break


WITHIN = 5  # a detection counts only when raised within this many logged points of the evidence


def within(kind: str) -> int:
    """Logged points after the injection by which a detection must be raised to count.

    K = 5 for kinds that one point can show; a rule that by definition needs a
    window of evidence (a plateau, a leak, swings, a slow trend) gets its window
    plus the same K, so the bound says "promptly once it can be known".
    """
    from steadytune.detect import DetectConfig

    c = DetectConfig()
    need = {
        "plateau": c.loss.plateau_min_points,
        "oscillation": c.loss.oscillation_window,
        "memory_leak": c.memory.window,
        "grad_vanishing": c.grad.vanishing_points + c.series.level_window,
        "throughput_drop": c.pace.throughput_points,
        "dataloader_bottleneck": c.pace.data_wait_points,
        "straggler": c.pace.straggler_points,
        "gpu_thermal": c.system.gpu_temp_points,
        "divergence": c.loss.divergence_points + c.series.level_window,
        "overfitting": c.series.noise_window,  # evaluations are sparse: their cadence in logged points
    }
    return need.get(kind, 0) + WITHIN


def synthetic(seed: int, per_shape: int, per_kind: int) -> dict[str, Tally]:
    tallies = {name: Tally() for name in SETS}
    for run in healthy_runs(seed, per_shape):
        res = all_alarms(to_events(run))
        for name in SETS:
            tallies[name].healthy_points += run.n
            tallies[name].false_alarms(run, res[name])
    for f in fault_runs(seed + 1, per_kind):
        res = all_alarms(to_events(f.run))
        for name in SETS:
            tallies[name].fault(f, res[name], ours=name == OURS, within=within(f.kind))
    return tallies


def _spread(xs: list[float], fmt: str) -> str:
    if len(xs) == 1:
        return format(xs[0], fmt)
    return f"{format(statistics.fmean(xs), fmt)} [{format(min(xs), fmt)}-{format(max(xs), fmt)}]"


def print_seeds(runs: list[dict[str, Tally]], seeds: list[int]) -> None:
    """Mean recall and false alarms over the seeds, with their range."""
    print(
        f"\n(a') over seeds {seeds}: mean [min-max]; a catch is raised within K logged points of the "
        "injection (K below), false alarms count on healthy runs and before each injection"
    )
    print(f"{'':24s}" + "".join(f"{n[:21]:>24s}" for n in SETS))
    recall = {
        n: [statistics.fmean(t[n].hits[k] / max(1, t[n].tries[k]) for k in FAULT_KINDS) for t in runs]
        for n in SETS
    }
    fa = {n: [1e4 * t[n].fa / max(1, t[n].healthy_points) for t in runs] for n in SETS}
    print(f"{'mean recall':24s}" + "".join(f"{_spread(recall[n], '.3f'):>24s}" for n in SETS))
    print(f"{'false alarms / 10k':24s}" + "".join(f"{_spread(fa[n], '.2f'):>24s}" for n in SETS))
    print("K per kind: " + ", ".join(f"{k} {within(k)}" for k in FAULT_KINDS))


def print_synthetic(t: dict[str, Tally]) -> None:
    short = {
        OURS: "steadytune",
        "llm-foundry KillLossSpike": "foundry",
        "OLMo-core 6σ": "olmo6σ",
        "Megatron 10x": "megatron",
        "W&B z-score": "wandb-z",
        "naive thresholds": "naive",
    }
    print("\n(a) synthetic suite: recall per kind (median delay in logged steps)")
    print(f"{'kind':24s}" + "".join(f"{short[n]:>18s}" for n in SETS))
    for kind in FAULT_KINDS:
        cells = []
        for n in SETS:
            tr, hit = t[n].tries[kind], t[n].hits[kind]
            d = t[n].delays[kind]
            delay = f"({statistics.median(d):g})" if d else ""
            cells.append(f"{hit / tr if tr else 0:.2f} {delay:>7s}")
        print(f"{kind:24s}" + "".join(f"{c:>18s}" for c in cells))
    print(
        f"{'false alarms / 10k':24s}"
        + "".join(f"{1e4 * t[n].fa / max(1, t[n].healthy_points):>18.2f}" for n in SETS)
    )
    print(
        f"{'mean recall':24s}"
        + "".join(
            f"{statistics.fmean(t[n].hits[k] / max(1, t[n].tries[k]) for k in FAULT_KINDS):>18.3f}"
            for n in SETS
        )
    )
    ours = t[OURS]
    print(
        f"healthy logged steps: {ours.healthy_points}; steadytune false alarms by kind: {dict(ours.fa_kinds)}"
    )
    spikes = ours.delays["loss_spike"]
    nans = ours.delays["nan_loss"]
    leaks = max(1, ours.hits["memory_leak"])
    print(
        f"spikes caught within 1 logged step: {sum(1 for d in spikes if d <= 1)}/{ours.tries['loss_spike']}; "
        f"NaN on the same step: {sum(1 for d in nans if d == 0)}/{ours.tries['nan_loss']}; "
        f"leaks flagged with >= 50% headroom free: {ours.leak_ok}/{leaks}"
    )


def real_logs_dir() -> Path | None:
    """The labelled real logs: $STEADYTUNE_REAL_LOGS, ../shared, or the copy vendored with the tests."""
    env = os.environ.get("STEADYTUNE_REAL_LOGS")
    path = Path(env) if env else Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "real-logs"
    if (path / "LABELS.tsv").is_file():
        return path.resolve()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.realdata import materialize

    return materialize(Path(tempfile.mkdtemp(prefix="steadytune-real-logs-")))


# The thresholds that are tuned on data, with the values the leave-one-out search may pick.
# Everything else is fixed a priori (docs/detectors.md says why), so it needs no held-out choice.
TUNED: dict[str, tuple[float, ...]] = {
    "loss.spike_z": (6.0, 7.0, 8.0),
    "loss.spike_min_ratio": (1.1, 1.25),
    "loss.young_spike_z": (3.0, 4.0, 5.0),
    "grad.quiet_spike_ratio": (3.0, 4.0, 5.0),
}
FA_WEIGHT = 2  # selection objective on the training files: caught - FA_WEIGHT * false alarms


def _grid() -> list[dict[str, float]]:
    import itertools

    keys = list(TUNED)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*TUNED.values())]


def _config(point: dict[str, float]) -> Any:
    from steadytune.detect import DetectConfig

    tree: dict[str, dict[str, float]] = {}
    for key, value in point.items():
        section, name = key.split(".")
        tree.setdefault(section, {})[name] = value
    return DetectConfig.model_validate(tree)


def _score(rows: list[Any], series: Any, alarms: list[ScoredAlarm]) -> FileScore:
    return score_file(rows, [r.step for r in series.records], alarms)


def _ours(series: Any, config: Any = None) -> list[ScoredAlarm]:
    """steadytune's episodes, each with the steps it fired at (a catch where it fired, one false alarm)."""
    run = replay_runs(series.runs(), series.system, config)
    return [
        ScoredAlarm(a.kind, a.severity, a.start_step, a.end_step, firings=fired)
        for a, fired in zip(run.anomalies, run.firings, strict=True)
    ]


def _add(total: FileScore, sc: FileScore) -> None:
    total.positives += sc.positives
    total.caught += sc.caught
    total.false_alarms += sc.false_alarms
    total.healthy_steps += sc.healthy_steps


def leave_one_out(
    labels: dict[str, list[Any]], loaded: dict[str, Any]
) -> tuple[FileScore, dict[str, FileScore], dict[str, dict[str, float]], FileScore]:
    """steadytune scored with, for each file, the tuned thresholds chosen on all the other files.

    Returns the leave-one-out total, the per-file scores, the choice made for each
    file, and the best in-sample total (the grid point chosen on every file at once,
    which is what an unheld tuning would report).
    """
    from steadytune.detect import DetectConfig

    grid = _grid()
    default = {k: float(DetectConfig().model_dump()[k.split(".")[0]][k.split(".")[1]]) for k in TUNED}
    scores: list[dict[str, FileScore]] = []
    for point in grid:
        cfg = _config(point)
        scores.append({f: _score(labels[f], s, _ours(s, cfg)) for f, s in loaded.items()})

    def objective(i: int, files: list[str]) -> tuple[float, bool]:
        got = sum(scores[i][f].caught - FA_WEIGHT * scores[i][f].false_alarms for f in files)
        return got, grid[i] == default  # ties go to the a-priori defaults

    files = [f for f in loaded if labels[f][0].cls != "ambiguous"]
    total, per_file, chosen = FileScore(), {}, {}
    for held in files:
        best = max(range(len(grid)), key=lambda i: objective(i, [f for f in files if f != held]))
        per_file[held], chosen[held] = scores[best][held], grid[best]
        _add(total, scores[best][held])
    oracle = max(range(len(grid)), key=lambda i: objective(i, files))
    in_best = FileScore()
    for f in files:
        _add(in_best, scores[oracle][f])
    return total, per_file, chosen, in_best


def real(root: Path) -> FileScore:
    labels = read_labels(root / "LABELS.tsv")
    total = {name: FileScore() for name in SETS}
    detail: list[str] = []
    loaded: dict[str, Any] = {}
    for file, rows in sorted(labels.items()):
        try:
            series = loaded[file] = load(root / file)
        except UnreadableLog as e:
            detail.append(f"  {file}: UNREADABLE ({e})")
            continue
        events = records_events(series.records)
        res = {OURS: _ours(series)}
        for cls in BASELINES:
            res[cls.name] = [ScoredAlarm(None, sev, st, st) for _k, sev, st in baseline_alarms(cls, events)]
        marks = []
        for name in SETS:
            sc = _score(rows, series, res[name])
            _add(total[name], sc)
            if rows[0].cls == "ambiguous":
                marks.append(f"{sc.alarms} alarms")
            elif sc.positives:
                marks.append(f"{sc.caught}/{sc.positives} caught, {sc.false_alarms} FA")
            else:
                marks.append(f"{sc.false_alarms} FA")
        detail.append(f"  {file[:44]:44s} {rows[0].cls:9s} " + " | ".join(marks))
    loo, per_file, chosen, in_best = leave_one_out(labels, loaded)
    negatives = [f for f in per_file if labels[f][0].cls == "negative"]
    loo_fa_healthy = sum(per_file[f].false_alarms for f in negatives)
    print(f"\n(b) real logs ({root}): per file, in-sample defaults, {' | '.join(SETS)}")
    print("\n".join(detail))
    print(f"{'':28s}" + "".join(f"{n[:17]:>18s}" for n in SETS))

    def row(label: str, cells: list[str]) -> None:
        print(f"{label:28s}" + "".join(f"{c:>18s}" for c in cells))

    # Baselines have no tuned thresholds (their published rules), so their held-out figure is their figure.
    row(
        "recall, leave-one-out",
        [f"{loo.caught}/{loo.positives}"] + [f"{total[n].caught}/{total[n].positives}" for n in SETS[1:]],
    )
    row(
        "false alarms, leave-one-out",
        [str(loo.false_alarms)] + [str(total[n].false_alarms) for n in SETS[1:]],
    )
    row("  of them on healthy files", [str(loo_fa_healthy)] + ["" for _ in SETS[1:]])
    row("recall, in-sample defaults", [f"{total[n].caught}/{total[n].positives}" for n in SETS])
    row("false alarms, in-sample", [str(total[n].false_alarms) for n in SETS])
    row("recall, in-sample best grid", [f"{in_best.caught}/{in_best.positives}"] + ["" for _ in SETS[1:]])
    row(
        "false alarms / 10k, in-sample",
        [f"{1e4 * total[n].false_alarms / max(1, total[n].healthy_steps):.1f}" for n in SETS],
    )
    print(f"healthy logged steps in the labelled files: {total[OURS].healthy_steps}")
    grid = _grid()
    print(
        f"leave-one-out: {len(grid)} grid points over {', '.join(TUNED)}; for each held-out file the point "
        f"with the most (caught - {FA_WEIGHT} x false alarms) on the other {len(per_file) - 1} labelled files"
    )
    moved = {f: c for f, c in chosen.items() if per_file[f].caught or per_file[f].false_alarms or True}
    changed = Counter(tuple(sorted(c.items())) for c in moved.values())
    for point, n in changed.most_common(3):
        print(f"  chosen for {n} files: " + ", ".join(f"{k}={v:g}" for k, v in point))
    missed = [f"{f} {sc.caught}/{sc.positives}" for f, sc in per_file.items() if sc.caught < sc.positives]
    fas = [f"{f} {sc.false_alarms}" for f, sc in per_file.items() if sc.false_alarms]
    print(f"  held-out misses: {', '.join(missed) or 'none'}")
    print(f"  held-out false alarms: {', '.join(fas) or 'none'}")
    return loo


def corpus(corpus_dir: Path, out: Path | None, defaults_only: bool = False, batch: str | None = None) -> None:
    """The labelled corpus and the development set, leave-one-repository-out (see _corpus.py).

    ``batch``: also the corpus files whose id starts with it alone (a batch added after the rules were
    written: what the rules do on logs they were never looked at with)."""
    from _corpus import SETS as CSETS
    from _corpus import (
        Row,
        baseline_scores,
        corpus_files,
        dev_files,
        leave_one_repo_out,
        markdown,
        run_all,
        tally,
    )

    from steadytune.detect import DetectConfig

    files = corpus_files(corpus_dir) + dev_files()
    default = {k: float(DetectConfig().model_dump()[k.split(".")[0]][k.split(".")[1]]) for k in TUNED}
    grid = [default] if defaults_only else _grid()
    t0 = time.perf_counter()
    runs = run_all(files, grid)
    for f in files:
        f.format = runs[f.name].format.split(":")[0]
    loro, chosen = leave_one_repo_out(files, runs, grid, grid.index(default), FA_WEIGHT)
    scores = {OURS: loro} | {name: baseline_scores(files, runs, name) for name in CSETS[1:]}
    head = [
        "detector",
        "recall",
        "precision by episode",
        "false alarms / 10 healthy runs",
        "median delay (intervals)",
    ]
    text = []
    sets = {
        "the new corpus": [f for f in files if f.collection == "corpus"],
        "the development set": [f for f in files if f.collection == "dev"],
        "both": files,
    }
    for title, group in sets.items():
        if not group:
            continue
        repos = len({f.repo for f in group})
        classes = Counter(f.cls for f in group)
        lines = [
            [name, *tally(group, scores[name], lambda f: "all").get("all", Row()).cells()] for name in CSETS
        ]
        text.append(
            markdown(
                f"{title}: {len(group)} files from {repos} repositories ({classes['positive']} positive, "
                f"{classes['negative']} negative, {classes['ambiguous']} ambiguous; "
                f"{sum(1 for f in group if f.format == 'unreadable')} unreadable)",
                head,
                lines,
            )
        )
    if batch:
        group = [f for f in sets["the new corpus"] if f.name.startswith(batch)]
        alone = {f"the batch {batch} alone": group}
        alone[f"the batch {batch}, RL and preference runs alone"] = [
            f for f in group if f.objective in ("rl", "preference")
        ]
        for title, members in alone.items():
            if not members:
                continue
            classes = Counter(f.cls for f in members)
            lines = [
                [name, *tally(members, scores[name], lambda f: "all").get("all", Row()).cells()]
                for name in CSETS
            ]
            text.append(
                markdown(
                    f"{title}: {len(members)} files from {len({f.repo for f in members})} repositories "
                    f"({classes['positive']} positive, {classes['negative']} negative, "
                    f"{classes['ambiguous']} ambiguous)",
                    head,
                    lines,
                )
            )
    new = sets["the new corpus"]
    for key, what in ((lambda f: f.objective, "objective"), (lambda f: f.format, "format")):
        names = CSETS if what == "objective" else [OURS]
        lines = []
        cats = sorted({key(f) for f in new})
        for cat in cats:
            members = [f for f in new if key(f) == cat]
            for name in names:
                row = tally(members, scores[name], lambda f: "all").get("all")
                if row is None:
                    continue
                lines.append([cat, f"{len(members)}", name, *row.cells()])
        text.append(markdown(f"the new corpus by {what}", [what, "files", *head], lines))
    rl = [f for f in new if f.objective in ("rl", "preference")]
    lines = [[name, *tally(rl, scores[name], lambda f: "all").get("all", Row()).cells()] for name in CSETS]
    text.append(markdown(f"the new corpus, RL and preference runs alone ({len(rl)} files)", head, lines))
    picks = Counter(tuple(sorted(grid[i].items())) for i in chosen.values())
    note = ", ".join(f"{k}={v:g}" for k, v in picks.most_common(1)[0][0]) if picks else ""
    text.append(
        f"Leave-one-repository-out over {len(chosen)} repositories: {len(grid)} grid points over "
        f"{', '.join(TUNED)}; the point chosen most often: {note} "
        f"({picks.most_common(1)[0][1]} repositories). "
        f"{time.perf_counter() - t0:.0f} s.\n"
    )
    misses = []
    for f in files:
        sc = loro.get(f.name)
        if sc and (sc.caught < sc.positives or sc.false_alarms):
            misses.append(
                f"  {f.name[:60]:60s} {f.objective:11s} {f.format:24s} {sc.caught}/{sc.positives} caught, "
                f"{sc.false_alarms} FA"
            )
    report = "\n".join(text)
    print("\n" + report)
    print("files with a miss or a false alarm (steadytune, held out):\n" + "\n".join(misses))
    if out is not None:
        out.write_text(report)


def sweep(seed: int, per_size: int) -> None:
    """Recall of one loss spike by size (noise sigmas, and at least 1.3x)."""
    import math

    rng = random.Random(seed)
    sizes = (4, 6, 8, 10, 12, 16)
    hits: dict[str, Counter[int]] = {n: Counter() for n in SETS}
    for k in sizes:
        for _ in range(per_size):
            run = base_run(rng, rng.choice(("smooth", "noisy", "power_law", "warmup", "converged", "bs1")))
            i0 = rng.randint(run.n // 3, 2 * run.n // 3)
            run.loss[i0] *= max(1.3, math.exp(k * run.sigma))
            res = all_alarms(to_events(run))
            for n in SETS:
                s0 = run.steps[i0]
                ok = any(
                    abs(st - s0) <= 2 * run.interval and sev != "info" and (n != OURS or kind == "loss_spike")
                    for kind, sev, st, _at, _again in res[n]
                )
                hits[n][k] += ok
    print("\n(c) one loss spike, recall by size in noise sigmas (>= 1.3x)")
    print(f"{'size':24s}" + "".join(f"{n[:17]:>18s}" for n in SETS))
    for k in sizes:
        print(f"{f'{k} sigma':24s}" + "".join(f"{hits[n][k] / per_size:>18.2f}" for n in SETS))


def speed() -> None:
    # A fixed pure-Python loop, so figures from different machines can be compared.
    t0 = time.process_time()
    sum(i * i for i in range(10**7))
    print(
        f"\n(d) speed (reference loop of 10^7 multiply-adds: {time.process_time() - t0:.2f} s CPU on "
        f"this machine)"
    )
    rng = random.Random(7)
    run = base_run(rng, "noisy", n=20000)
    events = [e for e in to_events(run) if e[0] == "step"]
    det = LiveDetector()
    worst, t0 = 0.0, time.process_time()
    for _, rec in events:
        a = time.perf_counter()
        det.observe_step(rec)
        worst = max(worst, time.perf_counter() - a)
    per = (time.process_time() - t0) / len(events)
    print(f"    live {per * 1e6:.1f} us/step (worst single step {worst * 1e3:.2f} ms); target < 1 ms")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trainer_state.json"
        n = 100_000
        big = base_run(rng, "noisy", n=n)
        history = [
            {
                "epoch": round(big.epoch[i] or 0.0, 4),
                "grad_norm": big.grad[i],
                "learning_rate": big.lr[i],
                "loss": round(big.loss[i], 4),
                "step": big.steps[i],
            }
            for i in range(n)
        ]
        path.write_text(json.dumps({"global_step": big.steps[-1], "log_history": history}, indent=2))
        t0, c0 = time.perf_counter(), time.process_time()
        series = load(path)
        t1 = time.perf_counter()
        detect(series.records, series.system)
        t2, c2 = time.perf_counter(), time.process_time()
        print(
            f"    analyze {n:,} steps (in process): read {t1 - t0:.2f} s + detect {t2 - t1:.2f} s = "
            f"{t2 - t0:.2f} s wall, {c2 - c0:.2f} s CPU; target < 2 s"
        )
        import subprocess

        exe = Path(sys.executable).with_name("steadytune")
        if exe.exists():
            t0 = time.perf_counter()
            subprocess.run(
                [str(exe), "analyze", str(path), "--format", "json"], capture_output=True, check=False
            )
            print(
                f"    steadytune analyze (new process, imports included): {time.perf_counter() - t0:.2f} "
                f"s wall"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small suite (about a minute)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-kind", type=int, default=None, help="runs per healthy shape and per anomaly kind")
    ap.add_argument("--seeds", type=int, default=None, help="synthetic seeds (default 3; --quick 2)")
    ap.add_argument(
        "--real-only", action="store_true", help="only the real logs: in-sample and leave-one-out"
    )
    ap.add_argument(
        "--corpus",
        nargs="?",
        const=Path(__file__).resolve().parent / "corpus",
        type=Path,
        help="only the labelled corpus and the development set, leave-one-repository-out",
    )
    ap.add_argument("--markdown", type=Path, help="with --corpus: also write the tables to this file")
    ap.add_argument(
        "--defaults", action="store_true", help="with --corpus: shipped defaults only (no held-out choice)"
    )
    ap.add_argument(
        "--batch",
        metavar="PREFIX",
        help="with --corpus: also score the corpus files whose id starts with PREFIX (e.g. CH) alone",
    )
    args = ap.parse_args()
    if args.corpus:
        corpus(args.corpus, args.markdown, args.defaults, args.batch)
        return 0
    if args.real_only:
        root = real_logs_dir()
        assert root is not None
        real(root)
        return 0
    per = args.per_kind or (8 if args.quick else 20)
    seeds = [args.seed + 10 * i for i in range(args.seeds or (2 if args.quick else 3))]
    t0 = time.perf_counter()
    runs = [synthetic(seed, per, per) for seed in seeds]
    print(
        f"synthetic suite: {per} healthy runs per shape x {len(HEALTHY_SHAPES)} shapes, "
        f"{per} runs per kind x {len(FAULT_KINDS)} kinds, seeds {seeds} ({time.perf_counter() - t0:.0f} s)"
    )
    print(f"\n(a) seed {seeds[0]} in detail")
    print_synthetic(runs[0])
    print_seeds(runs, seeds)
    root = real_logs_dir()
    if root is None:
        print("\n(b) real logs: not found (set STEADYTUNE_REAL_LOGS); skipped")
    else:
        real(root)
    sweep(args.seed + 2, 10 if args.quick else 40)
    speed()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The labelled real-log corpus, scored leave-one-repository-out, for ``detection.py --corpus``.

Two sets are read: the corpus collected for this benchmark (``benchmarks/corpus``: logs,
SOURCES.tsv with each file's repository, objective and tool, LABELS.tsv written blind) and
the development set vendored with the tests (``tests/assets/real-logs``). Files are grouped
by the repository they came from; each repository's files are scored with the thresholds
chosen on every other repository's files (leave-one-repository-out), so a threshold chosen
on a repository's files is never credited on them.

Reported per set, per objective and per format, for steadytune and each baseline:
recall (labelled anomalies caught), precision by episode (raised alarms that caught a label,
over those plus the false alarms), false alarms per 10 healthy runs (alarms on the negative
files, scaled), and the median detection delay in logging intervals (from the label's first
step to the point at which the alarm was raised). A file the readers cannot read raises
nothing: its labelled anomalies count as missed.
"""

from __future__ import annotations

import csv
import itertools
import statistics
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _synthetic_baselines import BASELINES, baseline_alarms, records_events

from steadytune.detect import DetectConfig, LiveDetector
from steadytune.detect.scoring import Alarm, FileScore, Label, read_labels, score_file
from steadytune.importers import UnreadableLog, load

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "benchmarks" / "corpus"
DEV = REPO / "tests" / "assets" / "real-logs"
OURS = "steadytune"
SETS = [OURS] + [b.name for b in BASELINES]

# How the corpus's objectives are reported: distillation is scored as SFT, a reward model as preference.
OBJECTIVE_GROUP = {
    "sft": "sft",
    "distillation": "sft",
    "preference": "preference",
    "reward_model": "preference",
    "rl": "rl",
    "pretraining": "pretraining",
}
# The development set's files name no objective in their sources; these are what the files are.
DEV_OBJECTIVES = {
    "A12": "preference",
    "A22": "preference",
    "A24": "pretraining",
    "A26": "pretraining",
    "A27": "pretraining",
    "A28": "pretraining",
    "A29": "pretraining",
    "A30": "pretraining",
    "A31": "pretraining",
    "A32": "pretraining",
}


@dataclass
class LogFile:
    """One labelled log: where it lies, what it is, and how it is labelled."""

    name: str
    path: Path
    repo: str  # the repository group: left out together
    objective: str
    tool: str
    collection: str  # "corpus" or "dev"
    labels: list[Label]
    format: str = "unreadable"

    @property
    def cls(self) -> str:
        return self.labels[0].cls


def _tsv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def corpus_files(corpus: Path = CORPUS) -> list[LogFile]:
    labels = read_labels(corpus / "LABELS.tsv")
    out = []
    for row in _tsv(corpus / "SOURCES.tsv"):
        out.append(
            LogFile(
                row["file"],
                corpus / "logs" / row["stored_as"],
                row["group"],
                OBJECTIVE_GROUP.get(row["objective"], "other"),
                row["tool"],
                "corpus",
                labels[row["file"]],
            )
        )
    return out


def dev_files(dev: Path = DEV) -> list[LogFile]:
    labels = read_labels(dev / "LABELS.tsv")
    repos = {r["file"]: r["repo"] for r in _tsv(dev / "SOURCES.tsv")}
    out = []
    for name, rows in sorted(labels.items()):
        path = dev / f"{name}.gz"
        out.append(
            LogFile(
                name,
                path if path.exists() else dev / name,
                repos[name],
                DEV_OBJECTIVES.get(name[:3], "sft"),
                "hf-trainer",
                "dev",
                rows,
            )
        )
    return out


# ---------------------------------------------------------------- one file, every detector


def ours(records: list[Any], config: DetectConfig | None = None) -> list[Alarm]:
    """steadytune's episodes, each with its firings and the step it was first raised at (live replay)."""
    det = LiveDetector(config)
    open_: dict[tuple[str, str, int | None], tuple[int, list[int]]] = {}
    done: list[Alarm] = []

    def close(a: Any) -> None:
        raised, fired = open_.pop(a.key, (a.start_step, [a.start_step]))
        done.append(Alarm(a.kind, a.severity, a.start_step, a.end_step, raised=raised, firings=tuple(fired)))

    def take(transitions: list[Any], step: int) -> None:
        for t in transitions:
            if t.state == "raised":
                open_[t.anomaly.key] = (step, [t.anomaly.start_step])
            elif t.state == "recurred" and t.anomaly.key in open_:
                open_[t.anomaly.key][1].append(t.fired.start_step)
            elif t.state == "resolved":
                close(t.anomaly)

    for rec in records:
        take(det.observe_step(rec), rec.step)
    # The log is over, as analyze's is: what only the whole run tells is raised at its last step.
    take(det.finish(), det.last_step)
    for a in det.open_anomalies():
        close(a)
    return done


@dataclass
class FileRun:
    """A file's alarms under every baseline and under each grid point of steadytune's tuned thresholds."""

    name: str
    format: str
    steps: list[int] = field(default_factory=list)
    baselines: dict[str, list[Alarm]] = field(default_factory=dict)
    grid: list[list[Alarm]] = field(default_factory=list)


def run_file(job: tuple[LogFile, list[dict[str, float]]]) -> FileRun:
    f, grid = job
    try:
        series = load(f.path)
    except UnreadableLog as e:
        return FileRun(f.name, f"unreadable: {e}")
    runs = series.runs()
    res = FileRun(f.name, series.format, [r.step for r in series.records])
    res.grid = [[] for _ in grid]
    for run in runs:  # a file holding several runs: each judged on its own, as analyze does
        events = records_events(run.records)
        for cls in BASELINES:
            res.baselines.setdefault(cls.name, []).extend(
                Alarm(None, sev, st, st)
                for _k, sev, st in baseline_alarms(cls, events)
                if run.report_from is None or st >= run.report_from
            )
        for alarms, point in zip(res.grid, grid, strict=True):
            alarms.extend(
                a
                for a in ours(run.records, config_of(point))
                if run.report_from is None or a.start >= run.report_from
            )
    return res


def config_of(point: dict[str, float]) -> DetectConfig | None:
    if not point:
        return None
    tree: dict[str, dict[str, float]] = {}
    for key, value in point.items():
        section, name = key.split(".")
        tree.setdefault(section, {})[name] = value
    return DetectConfig.model_validate(tree)


def grid_points(tuned: dict[str, tuple[float, ...]]) -> list[dict[str, float]]:
    keys = list(tuned)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*tuned.values())]


def run_all(files: list[LogFile], grid: list[dict[str, float]], workers: int = 2) -> dict[str, FileRun]:
    jobs = [(f, grid) for f in files]
    # The biggest files first, so the pool does not end waiting on one.
    jobs.sort(key=lambda j: -j[0].path.stat().st_size)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return {r.name: r for r in pool.map(run_file, jobs)}


# ---------------------------------------------------------------- leave one repository out


def leave_one_repo_out(
    files: list[LogFile],
    runs: dict[str, FileRun],
    grid: list[dict[str, float]],
    default: int,
    fa_weight: float,
) -> tuple[dict[str, FileScore], dict[str, int]]:
    """Each file scored with the grid point chosen on every other repository's scored files."""
    scored = [f for f in files if f.cls != "ambiguous"]
    table = {
        f.name: [score_file(f.labels, runs[f.name].steps, alarms) for alarms in runs[f.name].grid]
        if runs[f.name].grid
        else [score_file(f.labels, [], [])] * len(grid)
        for f in scored
    }
    # An unreadable positive file still counts its labels: they are all missed.
    for f in scored:
        for sc in table[f.name]:
            if not runs[f.name].steps:
                sc.positives = sum(1 for lb in f.labels if lb.cls == "positive")
    totals: dict[str, list[float]] = {}
    for repo in {f.repo for f in scored}:
        totals[repo] = [0.0] * len(grid)
    for f in scored:
        for i, sc in enumerate(table[f.name]):
            totals[f.repo][i] += sc.caught - fa_weight * sc.false_alarms
    overall = [sum(t[i] for t in totals.values()) for i in range(len(grid))]
    chosen: dict[str, int] = {}
    out: dict[str, FileScore] = {}
    for repo in totals:
        others = [overall[i] - totals[repo][i] for i in range(len(grid))]
        chosen[repo] = max(range(len(grid)), key=lambda i: (others[i], i == default))
    for f in scored:
        out[f.name] = table[f.name][chosen[f.repo]]
    return out, chosen


def baseline_scores(files: list[LogFile], runs: dict[str, FileRun], name: str) -> dict[str, FileScore]:
    out = {}
    for f in files:
        if f.cls == "ambiguous":
            continue
        run = runs[f.name]
        sc = score_file(f.labels, run.steps, run.baselines.get(name, []))
        if not run.steps:
            sc.positives = sum(1 for lb in f.labels if lb.cls == "positive")
        out[f.name] = sc
    return out


# ---------------------------------------------------------------- tables


@dataclass
class Row:
    """One line of a table: the files it covers and their summed score."""

    files: int = 0
    negatives: int = 0
    negatives_fa: int = 0  # false alarms on the negative (healthy) files
    score: FileScore = field(default_factory=FileScore)

    def cells(self) -> list[str]:
        s = self.score
        recall = f"{s.caught}/{s.positives} ({100 * s.caught / s.positives:.0f} %)" if s.positives else "-"
        raised = s.true_alarms + s.false_alarms
        precision = f"{100 * s.true_alarms / raised:.0f} % ({s.true_alarms}/{raised})" if raised else "-"
        per10 = f"{10 * self.negatives_fa / self.negatives:.1f}" if self.negatives else "-"
        delay = f"{statistics.median(s.delays):.1f}" if s.delays else "-"
        return [recall, precision, per10, delay]


def tally(
    files: Iterable[LogFile], scores: dict[str, FileScore], key: Callable[[LogFile], str]
) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for f in files:
        if f.name not in scores:
            continue
        for k in {key(f), "all"}:
            row = rows.setdefault(k, Row())
            row.files += 1
            sc = scores[f.name]
            row.score.add(sc)
            if f.cls == "negative":
                row.negatives += 1
                row.negatives_fa += sc.false_alarms
    return rows


def markdown(title: str, header: list[str], lines: list[list[str]]) -> str:
    out = [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(out) + "\n"

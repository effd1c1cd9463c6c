"""The registry: every detector, and the one place a :class:`DetectConfig` becomes detectors.

Each :class:`Entry` names a detector class, the dataclasses of its thresholds, the
config sections those are filled from *by name* (so a threshold is written twice:
as a config field and as a field of its detector's limits), what it observes, and
whether each rank has its own. The live engine builds from here and feeds each
detector the points of its feeds, in the order of :data:`REGISTRY`; the words
people read about each kind are gathered in :data:`KINDS`.

Adding a detector (docs/detectors.md, *Adding a detector*): its module (the
class, its limits, the words of any new kind), one entry here (and its module's
``KINDS`` below if it brings new kinds), and its thresholds in
``config/detect.py``. A detector needs no config to be built: a test builds one
from literals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from steadytune.config.detect import DetectConfig
from steadytune.detect import clip, grad, kl, learning, loss, memory, overfit, pace, reward, system, trend
from steadytune.detect.base import Detector, KindInfo
from steadytune.detect.clip import ClipLimits, ClipWatch
from steadytune.detect.early import FallCollapseLimits, FallCollapseWatch, ShortRiseLimits, ShortRiseWatch
from steadytune.detect.flat import FlatLimits, FlatRewardWatch
from steadytune.detect.grad import GradLimits, GradWatch
from steadytune.detect.gradflow import FlowLimits, GradFlowWatch, LayerLimits
from steadytune.detect.kl import KLLimits, KLWatch
from steadytune.detect.learning import LearningSignalWatch, SignalLimits
from steadytune.detect.loss import LossWatch
from steadytune.detect.loss_rules import LossLimits
from steadytune.detect.memory import HeadroomLimits, HeadroomWatch, LeakLimits, LeakWatch
from steadytune.detect.objective import ObjectiveLimits, ObjectiveWatch
from steadytune.detect.overfit import OverfitLimits, OverfitWatch
from steadytune.detect.pace import (
    StallLimits,
    StallWatch,
    StragglerLimits,
    StragglerWatch,
    ThroughputLimits,
    ThroughputWatch,
)
from steadytune.detect.points import RankStep, Signal, SystemPoint, Tick
from steadytune.detect.preference import PreferenceLimits, PreferenceWatch
from steadytune.detect.reward import RewardLimits, RewardWatch
from steadytune.detect.stats import SeriesLimits
from steadytune.detect.system import SystemLimits, SystemWatch
from steadytune.detect.trend import OscillationLimits, OscillationWatch, PlateauLimits, PlateauWatch


@dataclass(frozen=True)
class Entry:
    """One registered detector.

    ``make`` is called with one filled instance of each class in ``limits`` (in
    order), then ``args``, ``rank=`` for a per-rank detector, and for each
    ``uses`` item the attribute of a detector built before it (``"loss.hold_climb"``).
    """

    name: str
    make: Callable[..., Detector[Any]]
    feeds: tuple[type, ...]
    limits: tuple[type, ...]
    sections: tuple[str, ...]  # the ``detect.*`` sections the limits are filled from, first match wins
    per_rank: bool = False
    fresh_each_attempt: bool = False  # rebuilt when a rank's worker restarts (it warms up again)
    args: Mapping[str, Any] = field(default_factory=dict)
    uses: Mapping[str, str] = field(default_factory=dict)


REGISTRY: tuple[Entry, ...] = (
    # The primary rank's training signal. The loss and gradient series come first: the rules
    # after them read what those made of the step (docs/detectors.md, *Adding a detector*).
    Entry("stall", StallWatch, (Signal, Tick), (StallLimits,), ("pace",)),
    Entry("loss", LossWatch, (Signal,), (SeriesLimits, LossLimits), ("loss", "series")),
    Entry("objective", ObjectiveWatch, (Signal,), (ObjectiveLimits,), ("rl",)),
    Entry("grad", GradWatch, (Signal,), (SeriesLimits, GradLimits), ("grad", "series")),
    # An RL or preference run's own signals; the KL's yardstick and the learning signal read the reward's.
    Entry("reward", RewardWatch, (Signal,), (RewardLimits,), ("rl", "series")),
    Entry(
        "kl",
        KLWatch,
        (Signal,),
        (KLLimits,),
        ("rl", "loss", "series"),
        uses={"reward_improved": "reward.improved_step"},
    ),
    Entry("clip", ClipWatch, (Signal,), (ClipLimits,), ("rl", "series")),
    Entry(
        "learning_signal",
        LearningSignalWatch,
        (Signal,),
        (SignalLimits,),
        ("rl",),
        uses={"collapsed": "reward.is_collapsed"},
    ),
    # A DPO run's loss against ln 2, where it began; left to the windowed rule if it told.
    Entry(
        "preference",
        PreferenceWatch,
        (Signal,),
        (PreferenceLimits,),
        ("rl",),
        uses={"told": "learning_signal.told"},
    ),
    # The reward over the whole run, judged once it is over (``finish``); left to the three above if one told.
    Entry(
        "flat_reward",
        FlatRewardWatch,
        (Signal,),
        (FlatLimits,),
        ("rl",),
        uses={"told": "learning_signal.told", "fell": "reward.fell", "anchored": "preference.told"},
    ),
    Entry(
        "short_rise",
        ShortRiseWatch,
        (Signal,),
        (ShortRiseLimits,),
        ("loss",),
        uses={"hold": "loss.hold_climb"},
    ),
    Entry("fall_collapse", FallCollapseWatch, (Signal,), (FallCollapseLimits,), ("loss", "eval")),
    Entry("plateau", PlateauWatch, (Signal,), (PlateauLimits,), ("loss",)),
    Entry("oscillation", OscillationWatch, (Signal,), (OscillationLimits,), ("loss",)),
    Entry("grad_flow", GradFlowWatch, (Signal,), (FlowLimits,), ("grad", "rl")),
    Entry("overfit", OverfitWatch, (Signal,), (OverfitLimits,), ("eval",)),
    # Each rank's steps: memory and pace are the rank's own; stragglers compare the ranks.
    Entry(
        "leak",
        LeakWatch,
        (RankStep,),
        (LeakLimits,),
        ("memory",),
        per_rank=True,
        args={"metric": "mem_allocated_bytes", "total": "device", "fallback": "mem_peak_bytes"},
    ),
    Entry(
        "host_leak",
        LeakWatch,
        (RankStep,),
        (LeakLimits,),
        ("memory",),
        per_rank=True,
        args={"metric": "rss_bytes", "total": "ram"},
    ),
    Entry(
        "headroom",
        HeadroomWatch,
        (RankStep,),
        (HeadroomLimits,),
        ("memory",),
        per_rank=True,
        args={"metric": "mem_reserved_bytes"},
    ),
    Entry(
        "throughput",
        ThroughputWatch,
        (RankStep,),
        (ThroughputLimits,),
        ("pace",),
        per_rank=True,
        fresh_each_attempt=True,
    ),
    Entry("straggler", StragglerWatch, (RankStep,), (StragglerLimits,), ("pace",)),
    # System samples: GPUs, host RAM, disk.
    Entry("system", SystemWatch, (SystemPoint,), (SystemLimits,), ("system", "memory")),
)

ENTRIES: dict[str, Entry] = {e.name: e for e in REGISTRY}

# What each kind means, its likely cause and what to do: one table, so the console, alerts,
# analyze and the docs say the same. The words sit in the module that introduces the kind.
KINDS: dict[str, KindInfo] = {
    **loss.KINDS,
    **grad.KINDS,
    **trend.KINDS,
    **overfit.KINDS,
    **memory.KINDS,
    **pace.KINDS,
    **system.KINDS,
    **reward.KINDS,
    **kl.KINDS,
    **clip.KINDS,
    **learning.KINDS,
}


def fill(cls: type, cfg: DetectConfig, sections: tuple[str, ...]) -> Any:
    """An instance of the limits dataclass ``cls``, each field taken from the first section naming it."""
    values = {}
    for f in dataclasses.fields(cls):
        for name in sections:
            section = getattr(cfg, name)
            if f.name in type(section).model_fields:
                values[f.name] = getattr(section, f.name)
                break
        else:
            raise LookupError(
                f"{cls.__name__}.{f.name} is a field of none of detect.{', detect.'.join(sections)}"
            )
    return cls(**values)


def make(entry: Entry, cfg: DetectConfig, built: Mapping[str, Any], rank: int | None = None) -> Detector[Any]:
    """Build one registered detector; ``built`` holds the detectors its ``uses`` name."""
    kwargs = dict(entry.args)
    if entry.per_rank:
        kwargs["rank"] = rank
    for arg, path in entry.uses.items():
        other, attr = path.split(".")
        kwargs[arg] = getattr(built[other], attr)
    return entry.make(*(fill(cls, cfg, entry.sections) for cls in entry.limits), **kwargs)


def run_detectors(cfg: DetectConfig, registry: tuple[Entry, ...] = REGISTRY) -> dict[str, Detector[Any]]:
    """The detectors the run has once, by entry name, in registry order."""
    built: dict[str, Detector[Any]] = {}
    for e in registry:
        if not e.per_rank:
            built[e.name] = make(e, cfg, built)
    return built


def rank_detectors(
    cfg: DetectConfig, rank: int, fresh_only: bool = False, registry: tuple[Entry, ...] = REGISTRY
) -> dict[str, Detector[Any]]:
    """The detectors each rank has of its own (only those a restart rebuilds, with ``fresh_only``)."""
    built: dict[str, Detector[Any]] = {}
    for e in registry:
        if e.per_rank and (e.fresh_each_attempt or not fresh_only):
            built[e.name] = make(e, cfg, built, rank)
    return built


def all_detectors(
    cfg: DetectConfig, rank: int = 0, registry: tuple[Entry, ...] = REGISTRY
) -> Iterator[Detector[Any]]:
    """Every registered detector once (per-rank ones for ``rank``): for tests and docs."""
    yield from run_detectors(cfg, registry).values()
    yield from rank_detectors(cfg, rank, registry=registry).values()


def layer_limits(cfg: DetectConfig) -> LayerLimits:
    """The per-layer gradient-flow thresholds: for the detector and for the heat map that marks alike."""
    return fill(FlowLimits, cfg, ("grad", "rl")).layers()

"""Episodes, not points: a condition that goes on or comes back is one anomaly, counted.

Every series here is generated: a healthy loss with a condition that flickers N
times, at several logging intervals; a memory share that crosses the warning and
then the critical line within one episode; conditions far enough apart to be two.
"""

from __future__ import annotations

import math

import pytest

from steadytune.config.detect import DetectConfig
from steadytune.detect import LiveDetector, detect
from steadytune.detect.base import Finding
from steadytune.detect.build import KINDS
from steadytune.detect.episodes import Episodes
from steadytune.detect.live import format_transition
from steadytune.detect.offline import replay
from steadytune.records import Anomaly, StepRecord, from_dict, to_dict
from tests.unit.detect.helpers import feed, noisy, records

GAP = DetectConfig().episode_gap_points


def _flicker(n: int, every: int, lead: int = 40, interval: int = 1, seed: int = 3) -> list[StepRecord]:
    """A healthy loss that reads exactly 0 for two points every ``every`` points after ``lead``,
    ``n`` times (one zero alone is no collapse)."""
    total = lead + n * every + 20
    losses = noisy(total, level=2.0, sigma=0.03, seed=seed, decay=0.01)
    for k in range(n):
        losses[lead + k * every] = losses[lead + k * every + 1] = 0.0
    return records(losses, interval=interval)


@pytest.mark.parametrize("interval", [1, 10, 500])
@pytest.mark.parametrize("n", [2, 7])
def test_zeros_every_tenth_point_are_one_collapse_counted_n_times(n: int, interval: int) -> None:
    recs = _flicker(n, every=10, interval=interval)
    ts = feed(recs)
    collapses = [t for t in ts if t.anomaly.kind == "loss_collapse"]
    assert [t.state for t in collapses if t.state == "raised"] == ["raised"]
    assert sum(t.state == "recurred" for t in collapses) == n - 1
    (episode,) = [a for a in detect(recs) if a.kind == "loss_collapse"]
    assert episode.count == n and episode.peak == 0.0 and episode.severity == "critical"
    assert (episode.start_step, episode.end_step) == (41 * interval, (41 + (n - 1) * 10) * interval)


def _nans(at: list[int], total: int, seed: int = 3) -> list[float]:
    """A healthy loss that reads NaN at each of ``at`` (an event: each NaN judged on its own step)."""
    losses = noisy(total, level=2.0, sigma=0.03, seed=seed, decay=0.01)
    for i in at:
        losses[i] = math.nan
    return losses


def test_a_condition_quiet_past_the_gap_is_a_new_episode() -> None:
    every = GAP + 5  # further apart than the gap: each NaN is its own episode
    at = [40, 40 + every, 40 + 2 * every]
    found = [a for a in detect(records(_nans(at, at[-1] + 20))) if a.kind == "nan_loss"]
    assert [(a.start_step, a.count) for a in found] == [(i + 1, 1) for i in at]


def test_the_gap_counts_logging_intervals_not_logged_points() -> None:
    """A log of snippets: two NaNs twelve logged points apart, but thousands of steps, are two episodes."""
    recs = records(_nans([40, 52], 80, seed=5))
    steps = [r.step if i < 45 else r.step + 5000 for i, r in enumerate(recs)]
    recs = [
        StepRecord(step=s, ts=float(i), loss=r.loss) for i, (s, r) in enumerate(zip(steps, recs, strict=True))
    ]
    found = [(a.start_step, a.count) for a in detect(recs) if a.kind == "nan_loss"]
    assert found == [(41, 1), (5053, 1)]
    near = [
        (a.start_step, a.count) for a in detect(records(_nans([40, 52], 80, seed=5))) if a.kind == "nan_loss"
    ]
    assert near == [(41, 2)]  # the same twelve points, a step apart each: one episode


@pytest.mark.parametrize("apart", [GAP + 5, 10 * GAP])
def test_a_lasting_condition_that_comes_back_however_late_is_its_episode(apart: int) -> None:
    """A collapse (a loss of exactly 0) quiet for longer than the gap and back: the model that memorised
    its data, or the bug that zeroed its loss, is still there; one episode, counted, over at the end."""
    ts = feed(_flicker(3, every=apart))
    collapses = [t for t in ts if t.anomaly.kind == "loss_collapse"]
    assert [t.state for t in collapses] == ["raised", "cleared", "recurred", "cleared", "recurred", "cleared"]
    assert KINDS["loss_collapse"].lasting and KINDS["overfitting"].lasting and not KINDS["nan_loss"].lasting
    (episode,) = [a for a in detect(_flicker(3, every=apart)) if a.kind == "loss_collapse"]
    assert (episode.start_step, episode.end_step, episode.count) == (41, 41 + 2 * apart, 3)
    book = Episodes(KINDS, GAP, frozenset())
    book.apply([Finding("loss_collapse", "loss", 5, True), Finding("loss_spike", "loss", 5, True)], 5)
    book.apply([Finding("loss_collapse", "loss", 6, False), Finding("loss_spike", "loss", 6, False)], 6)
    assert book.quiet == 1  # the spike's may expire; the collapse's waits for the run's end
    assert [t.anomaly.kind for t in book.expire(10_000, 1.0)] == ["loss_spike"]
    assert [(t.state, t.anomaly.kind) for t in book.close()] == [("resolved", "loss_collapse")]


def test_the_episode_ends_once_quiet_for_the_gap_with_its_count_and_peak() -> None:
    recs = records(_nans([40, 45, 50, 55], 100))
    ts = feed(recs)
    states = [t.state for t in ts if t.anomaly.kind == "nan_loss"]
    assert states[0] == "raised" and states[-1] == "resolved" and states.count("resolved") == 1
    assert states.count("cleared") == 4 and states.count("recurred") == 3
    last = next(t for t in ts if t.state == "resolved" and t.anomaly.kind == "nan_loss")
    assert last.anomaly.count == 4 and last.anomaly.end_step == 41 + 15
    run = replay(recs)
    (i,) = [k for k, a in enumerate(run.anomalies) if a.kind == "nan_loss"]
    assert run.firings[i] == (41, 46, 51, 56)


@pytest.mark.parametrize("every", [10, 37])
def test_a_lone_zero_now_and_then_is_no_collapse(every: int) -> None:
    """A placeholder ``avg_loss=0.0000`` printed every tenth step, or a reward model's 1 - margin
    rounding to 0.0 in bf16 now and then: single zeros between real values."""
    losses = noisy(40 + 49 * every + 20, level=2.0, sigma=0.03, seed=4, decay=0.01)
    for k in range(49):
        losses[40 + k * every] = 0.0
    assert [a for a in detect(records(losses)) if a.kind == "loss_collapse"] == []


def test_a_spike_that_returns_peaks_at_its_highest_point() -> None:
    losses = noisy(120, sigma=0.02, seed=8)
    losses[60] *= 3.0
    losses[66] *= 5.0  # back within the gap, higher
    (spike,) = [a for a in detect(records(losses)) if a.kind == "loss_spike"]
    assert spike.count == 2 and spike.start_step == 61 and spike.peak == pytest.approx(losses[66], rel=1e-5)


def test_severity_rising_mid_episode_is_one_episode_escalated() -> None:
    """Memory held creeps past the warning share, then the critical one: one episode, told twice."""
    total = 100 << 30
    shares = [0.80] * 10 + [0.94] * 5 + [0.95] * 3 + [0.99] * 4 + [0.80] * 30
    det = LiveDetector(DetectConfig.model_validate({"memory": {"device_total_bytes": total}}))
    ts = []
    for i, share in enumerate(shares):
        rec = StepRecord(step=i + 1, ts=float(i), loss=2.0, mem_reserved_bytes=int(share * total))
        ts += det.observe_step(rec)
    got = [
        (t.state, t.anomaly.severity, t.anomaly.start_step) for t in ts if t.anomaly.kind == "memory_headroom"
    ]
    assert got == [
        ("raised", "warning", 11),
        ("escalated", "critical", 11),
        ("cleared", "critical", 11),
        ("resolved", "critical", 11),
    ]
    assert [t.was for t in ts if t.state == "escalated"] == ["warning"]


def test_an_anomaly_written_before_episodes_reads_as_one_firing() -> None:
    new = Anomaly("loss_spike", "warning", 10, 12, "loss", {"value": 5.0}, count=3, peak=5.0)
    data = to_dict(new)
    assert from_dict(data) == new
    old = {k: v for k, v in data.items() if k not in ("count", "peak")}
    assert from_dict(old) == Anomaly("loss_spike", "warning", 10, 12, "loss", {"value": 5.0})
    assert from_dict(old).count == 1 and from_dict(old).peak is None


# ---- groups: the layers of one model ---------------------------------------------------------------


def _flow(norms: dict[str, float]) -> dict[str, dict[str, float]]:
    return {layer: {"norm": n, "zero_frac": 0.0} for layer, n in norms.items()}


def _layered_run(
    blowups: dict[int, tuple[float, dict[str, float]]], total: int = 80, seed: int = 11
) -> list[StepRecord]:
    """A healthy run whose every step records its layers' gradient flow; at each step of ``blowups``
    the model's norm and the layers named there take the values given (the others stay healthy)."""
    losses = noisy(total, level=2.0, sigma=0.02, seed=seed, decay=0.005)
    grads = noisy(total, level=1.0, sigma=0.02, seed=seed + 1)
    healthy = {"embeddings": 0.3, "layers.0": 0.5, "layers.1": 0.4, "lm_head": 0.6}
    out = []
    for r in records(losses, grads):
        g, layers = blowups.get(r.step, (r.grad_norm, {}))
        out.append(
            StepRecord(
                step=r.step,
                ts=r.ts,
                loss=r.loss,
                grad_norm=g,
                extra={"gradflow": _flow({**healthy, **layers})},
            )
        )
    return out


def test_layers_blowing_up_with_the_model_at_one_step_are_one_episode_told_once() -> None:
    """One bad update: the model's norm and two layers' explode at step 60. Before, three episodes
    (grad_norm, grad_norm/embeddings, grad_norm/layers.0): three raises, three resolves."""
    recs = _layered_run({60: (5000.0, {"embeddings": 900.0, "layers.0": 4000.0})})
    ts = [t for t in feed(recs) if t.anomaly.kind == "grad_explosion"]
    assert [t.state for t in ts if t.state in ("raised", "resolved")] == ["raised", "resolved"]
    raised, resolved = ts[0].anomaly, ts[-1].anomaly
    assert raised.metric == resolved.metric == "grad_norm" and raised.start_step == 60
    # The raise names every layer of the step, and the worst (the model's own norm is the largest).
    assert set(raised.evidence["metrics"]) == {"grad_norm", "grad_norm/embeddings", "grad_norm/layers.0"}
    assert raised.evidence["worst"] == "grad_norm" and raised.peak == pytest.approx(5000.0)
    (episode,) = [a for a in detect(recs) if a.kind == "grad_explosion"]
    assert episode.metric == "grad_norm" and episode.count == 1


def test_layers_alone_are_one_episode_its_worst_named_and_over_when_the_last_clears() -> None:
    """Layers vanish without the model's norm saying so: layers.1 from step 40, lm_head from 41,
    layers.1 is over at 44 and lm_head at 46. One episode, quiet only when both are over."""
    low = 1e-5
    blowups = {40: (1.0, {"layers.1": low})}
    blowups.update({s: (1.0, {"layers.1": low * 2, "lm_head": low / 10}) for s in (41, 42, 43)})
    blowups[44] = blowups[45] = (1.0, {"lm_head": low / 10})
    ts = [t for t in feed(_layered_run(blowups)) if t.anomaly.kind == "grad_vanishing"]
    assert [(t.state, t.anomaly.end_step) for t in ts] == [("raised", 40), ("cleared", 45), ("resolved", 45)]
    done = ts[-1].anomaly
    assert done.metric == "grad_norm" and done.count == 1
    assert done.evidence["metrics"] == ["grad_norm/layers.1", "grad_norm/lm_head"]
    assert done.peak == pytest.approx(low / 10) and done.evidence["worst"] == "grad_norm/lm_head"
    assert done.evidence["layer"] == "lm_head"


def test_a_group_that_comes_back_within_the_gap_is_the_same_episode_counted() -> None:
    bad = (1.0, {"layers.0": 500.0})
    ts = [t for t in feed(_layered_run({50: bad, 55: bad})) if t.anomaly.kind == "grad_explosion"]
    assert [t.state for t in ts] == ["raised", "cleared", "recurred", "cleared", "resolved"]
    assert ts[-1].anomaly.count == 2 and ts[-1].anomaly.metric == "grad_norm"


def test_grouped_findings_of_other_ranks_and_kinds_stay_apart() -> None:
    """The group joins one kind on one rank: a vanishing layer and an exploding one are two episodes."""
    book = Episodes(KINDS, GAP, frozenset())

    def layer(kind: str, name: str, value: float, rank: int | None = None) -> Finding:
        return Finding(kind, f"grad_norm/{name}", 5, True, rank, evidence={"value": value}, group="grad_norm")

    found = [
        layer("grad_explosion", "layers.0", 300.0),
        layer("grad_vanishing", "layers.1", 1e-6),
        layer("grad_explosion", "layers.0", 300.0, rank=1),
        layer("grad_explosion", "lm_head", 200.0),
    ]
    got = [(t.state, t.anomaly.key, t.anomaly.evidence["metrics"]) for t in book.apply(found, 5)]
    assert got == [
        ("raised", ("grad_explosion", "grad_norm", None), ["grad_norm/layers.0", "grad_norm/lm_head"]),
        ("raised", ("grad_vanishing", "grad_norm", None), ["grad_norm/layers.1"]),
        ("raised", ("grad_explosion", "grad_norm", 1), ["grad_norm/layers.0"]),
    ]
    # A member's clearing finding names no group; the episode is quiet once its last member is over.
    assert book.apply([Finding("grad_explosion", "grad_norm/layers.0", 6, False)], 6) == []
    (cleared,) = book.apply([Finding("grad_explosion", "grad_norm/lm_head", 7, False)], 7)
    assert cleared.state == "cleared" and cleared.anomaly.key == ("grad_explosion", "grad_norm", None)


# ---- a rewind: what a replay rebuilt was told already ----------------------------------------------


def test_after_a_rewind_the_replayed_episodes_are_not_resolved_again() -> None:
    """A spike at 61, resolved at its gap; a collapse at 71 still open at 75, cleared by the rewind to
    75 as the supervisor does. The detector rebuilt by replaying up to 75 holds both open: before,
    the new timeline resolved each of them a second time."""
    losses = noisy(140, level=2.0, sigma=0.02, seed=21, decay=0.005)
    losses[60] *= 4.0
    losses[70] = losses[71] = 0.0
    recs = records(losses)
    rebuilt = LiveDetector()
    told = [t for r in recs[:75] for t in rebuilt.observe_step(r)]
    assert {t.anomaly.kind for t in told if t.state == "raised"} >= {"loss_spike", "loss_collapse"}
    assert {a.kind for a in rebuilt.open_anomalies()} >= {"loss_spike", "loss_collapse"}
    rebuilt.settle_episodes()
    after = [t for r in recs[75:] for t in rebuilt.observe_step(r)] + rebuilt.close()
    assert [t for t in after if t.state in ("resolved", "cleared", "recurred")] == []
    assert rebuilt.open_anomalies() == []


def test_an_episode_told_over_holds_on_in_silence_and_a_new_firing_after_it_is_a_new_episode() -> None:
    """A condition that still holds after the rewind is the episode people were told of, not a new one
    (nor a new firing for the policy to act on again); once it has cleared, a firing is a new episode."""
    book = Episodes(KINDS, GAP, frozenset())

    def spike(step: int, active: bool = True) -> list[Finding]:
        return [Finding("loss_spike", "loss", step, active, evidence={"value": 9.0} if active else None)]

    assert [t.state for t in book.apply(spike(10), 10)] == ["raised"]
    book.settle()
    assert book.open() == []  # told over: a second rewind does not clear it again
    assert book.apply(spike(11), 11) == []
    assert book.apply([Finding("loss_spike", "loss", 12, True, severity="critical")], 12) == []
    assert book.apply(spike(13, active=False), 13) == []
    (again,) = book.apply(spike(14), 14)
    assert again.state == "raised" and again.anomaly.start_step == 14 and again.anomaly.count == 1
    book.apply(spike(15, active=False), 15)
    book.settle()
    assert book.expire(15 + GAP + 1, 1.0) == [] and book.quiet == 0


# ---- parts: a kind that is one face of a graver one -----------------------------------------------


@pytest.mark.parametrize("at", [8, 15, 60])
@pytest.mark.parametrize("ratio", [120.0, 400.0])
def test_a_norm_far_over_its_level_is_one_explosion_not_a_spike_beside_it(at: int, ratio: float) -> None:
    """A norm over ``explosion_ratio`` times its level, early or late: the spike rules fire on it as
    well, and before, the user got a warning and a critical alert for the one point."""
    losses = noisy(100, level=2.0, sigma=0.02, seed=at, decay=0.005)
    grads = [0.8 * (1.0 + 0.05 * ((i * 7) % 5 - 2)) for i in range(100)]
    grads[at - 1] *= ratio
    ts = feed(records(losses, grads))
    raised = [t.anomaly.kind for t in ts if t.state == "raised" and t.anomaly.metric == "grad_norm"]
    assert raised == ["grad_explosion"]
    (episode,) = [a for a in detect(records(losses, grads)) if a.metric == "grad_norm"]
    assert episode.kind == "grad_explosion" and episode.start_step == at


def test_a_nan_norm_under_a_nan_loss_is_the_nan_loss_episode_even_after_the_loss_is_finite_again() -> None:
    """Three NaN steps: the norm's own rule holds a few finite points longer than the loss's. One
    episode (nan_loss), and no nonfinite_grad raised when the loss's episode goes quiet first."""
    losses = noisy(80, level=2.0, sigma=0.02, seed=4, decay=0.005)
    grads = [1.0] * 80
    for i in (39, 40, 41):
        losses[i] = grads[i] = float("nan")
    ts = feed(records(losses, grads))
    assert [(t.state, t.anomaly.kind) for t in ts if t.state == "raised"] == [("raised", "nan_loss")]
    assert [a.kind for a in detect(records(losses, grads))] == ["nan_loss"]


def test_a_nan_norm_under_a_finite_loss_is_its_own_episode() -> None:
    """An fp16 overflow the scaler skipped: the loss is fine, so the NaN norm is no part of anything."""
    losses = noisy(80, level=2.0, sigma=0.02, seed=4, decay=0.005)
    grads = [1.0] * 80
    grads[40] = float("inf")
    assert [a.kind for a in detect(records(losses, grads))] == ["nonfinite_grad"]


def test_a_part_that_fired_first_grows_into_its_whole_and_parts_of_other_ranks_stay_apart() -> None:
    book = Episodes(KINDS, GAP, frozenset())

    def f(kind: str, step: int, active: bool = True, rank: int | None = None, v: float = 50.0) -> Finding:
        return Finding(kind, "grad_norm", step, active, rank, evidence={"value": v} if active else None)

    # A spike told at step 5 that becomes an explosion at 7: the spike's episode grows into the explosion.
    assert [t.state for t in book.apply([f("grad_spike", 5, v=60.0)], 5)] == ["raised"]
    (got,) = book.apply([f("grad_spike", 7), f("grad_explosion", 7)], 7)
    assert (got.state, got.was, [p.key for p in got.took]) == (
        "escalated",
        "warning",
        [("grad_spike", "grad_norm", None)],
    )
    a = got.anomaly
    assert (a.kind, a.severity, a.start_step, a.end_step, a.count, a.peak) == (
        "grad_explosion",
        "critical",
        5,
        7,
        2,
        60.0,
    )
    assert (got.fired.kind, got.fired.start_step, got.fired.count) == ("grad_explosion", 7, 1)
    assert [e.kind for e in book.open()] == ["grad_explosion"]
    # An explosion on rank 0 holds no part of rank 1's spike.
    other = book.apply([f("grad_spike", 8, rank=1), f("grad_explosion", 8)], 8)
    assert [(t.state, t.anomaly.kind, t.anomaly.rank) for t in other] == [("raised", "grad_spike", 1)]
    # Taken in while the whole holds, a part is told by nothing until it clears, even after the whole.
    book2 = Episodes(KINDS, GAP, frozenset())
    assert [t.anomaly.kind for t in book2.apply([f("grad_spike", 9), f("grad_explosion", 9)], 9)] == [
        "grad_explosion"
    ]
    over = book2.apply([f("grad_explosion", 10, active=False), f("grad_spike", 10)], 10)
    assert [t.state for t in over] == ["cleared"]
    assert book2.apply([f("grad_spike", 11, active=False)], 11) == []
    # Cleared, the part is free again; within the gap of the explosion's quiet episode, a spike is still
    # that trouble (an explosion that came down to a spike): part of it, told by nothing.
    assert book2.apply([f("grad_spike", 12)], 12) == []
    assert book2.apply([f("grad_spike", 13, active=False)], 13) == []
    # Once the explosion's episode is over, a spike alone is its own episode.
    assert [t.state for t in book2.expire(30, 1.0)] == ["resolved"]
    assert [t.anomaly.kind for t in book2.apply([f("grad_spike", 30)], 30)] == ["grad_spike"]


def _spike_and_explosion(first: str, apart: int, at: int) -> list[StepRecord]:
    """A healthy run whose grad norm jumps 12x at point ``at`` and 400x ``apart`` points later (a spike
    that grows into an explosion), or the reverse (``first`` = "explosion": it comes down to a spike)."""
    losses = noisy(120, level=2.0, sigma=0.02, seed=at, decay=0.005)
    grads = [0.8 * math.exp(0.05 * math.sin(1.7 * i)) for i in range(120)]
    small, big = 12.0, 400.0
    grads[at] *= small if first == "spike" else big
    grads[at + apart] *= big if first == "spike" else small
    return records(losses, grads)


@pytest.mark.parametrize("at", [30, 75])
@pytest.mark.parametrize("apart", [1, 2, 3])
@pytest.mark.parametrize("first", ["spike", "explosion"])
def test_a_spike_and_an_explosion_a_few_points_apart_are_one_episode(first: str, apart: int, at: int) -> None:
    """One trouble, whichever came first: offline one grad_explosion episode from the first jump,
    counting both; live, the same, told once raised and once when it grew graver (never a second
    raise, never a resolved spike beside the explosion)."""
    recs = _spike_and_explosion(first, apart, at)
    (episode,) = [a for a in detect(recs) if a.metric == "grad_norm"]
    assert (episode.kind, episode.start_step, episode.severity) == ("grad_explosion", at + 1, "critical")
    assert episode.count == (2 if first == "spike" else 1)
    ts = [t for t in feed(recs) if t.anomaly.metric == "grad_norm"]
    told = [(t.state, t.anomaly.kind) for t in ts if t.state in ("raised", "escalated", "resolved")]
    if first == "spike":
        assert told == [
            ("raised", "grad_spike"),
            ("escalated", "grad_explosion"),
            ("resolved", "grad_explosion"),
        ]
        (grew,) = [t for t in ts if t.took]
        assert grew.fired.start_step == at + 1 + apart and grew.anomaly.start_step == at + 1
        line = format_transition(grew)
        assert line.startswith(
            f"CRITICAL grad_explosion at step {at + 1 + apart} (grew out of the grad_spike raised at step "
            f"{at + 1}: one episode from step {at + 1}, 2 times"
        )
    else:
        assert told == [("raised", "grad_explosion"), ("resolved", "grad_explosion")]

"""How a plan revision's skip list reads on the run page."""

from __future__ import annotations

from steadytune.records import PlanRevision, from_json, to_json
from steadytune.web.api import skip_summary


def plan(**kw: object) -> PlanRevision:
    return PlanRevision(revision=1, ts=0.0, reason="loss_spike", **kw)  # type: ignore[arg-type]


def test_the_skip_list_is_counted_in_samples_and_named_by_steps() -> None:
    # 144 samples in scattered ranges (a shuffled sampler): one count, one step window.
    ranges = tuple((i * 10, i * 10 + 7) for i in range(18))
    assert skip_summary(plan(skip_ranges=ranges, skip_steps=((31, 48),))) == "144 samples (steps 31–48)"
    assert skip_summary(plan(skip_ranges=((5, 5),), skip_steps=((7, 7),))) == "1 sample (step 7)"
    two = plan(skip_ranges=((0, 999), (2000, 2499)), skip_steps=((31, 48), (90, 90)))
    assert skip_summary(two) == "1,500 samples (steps 31–48, 90)"


def test_a_plan_without_steps_or_skips() -> None:
    # A plan written before the steps were recorded still gives its count.
    assert skip_summary(plan(skip_ranges=((0, 9),))) == "10 samples"
    assert skip_summary(plan()) == ""


def test_skip_steps_survive_the_stream_format() -> None:
    p = plan(skip_ranges=((1, 2),), skip_steps=((3, 4),))
    back = from_json(to_json(p))
    assert (
        isinstance(back, PlanRevision)
        and back.skip_steps == ((3, 4),)
        and skip_summary(back) == skip_summary(p)
    )

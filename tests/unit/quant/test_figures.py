"""The arithmetic of quant-check against answers known in closed form, independent of its code."""

from __future__ import annotations

import math

import pytest
import torch

from steadytune.quant.figures import (
    Figures,
    Thresholds,
    compare,
    judge,
    kl_divergence,
    near_uniform,
    percentile,
    perplexity,
    relative_change,
    verdict,
)
from steadytune.quant.tokens import label_logprobs, scored_logprobs, token_kl, top1_matches


def test_a_uniform_model_has_the_vocabulary_size_as_perplexity() -> None:
    vocab = 50
    logits = torch.zeros(2, 7, vocab)  # every next token equally likely
    labels = torch.randint(0, vocab, (2, 7))
    labels[0, :3] = -100  # a masked prompt is not scored
    logp, targets = scored_logprobs(logits, labels)
    assert logp.shape == (2 * 6 - 2, vocab)  # shifted by one, minus the masked targets
    assert perplexity(label_logprobs(logp, targets).tolist()) == pytest.approx(vocab, rel=1e-6)


def test_perplexity_of_a_model_certain_and_right_is_one() -> None:
    assert perplexity([0.0, 0.0, 0.0]) == 1.0
    assert perplexity([math.log(0.5)] * 4) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no scored tokens"):
        perplexity([])


def test_kl_of_identical_distributions_is_zero_and_top1_agrees() -> None:
    logp = torch.log_softmax(torch.randn(20, 33), dim=-1)
    assert torch.allclose(token_kl(logp, logp), torch.zeros(20), atol=1e-7)
    assert bool(top1_matches(logp, logp).all())


def test_token_kl_matches_the_closed_form() -> None:
    p, q = [0.5, 0.5], [0.9, 0.1]
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert kl_divergence(p, q) == pytest.approx(expected)
    ref, cand = torch.tensor([p]).log(), torch.tensor([q]).log()
    assert token_kl(ref, cand).item() == pytest.approx(expected, rel=1e-5)
    # KL is not symmetric: the direction is reference -> candidate.
    assert token_kl(cand, ref).item() == pytest.approx(kl_divergence(q, p), rel=1e-5)
    assert kl_divergence([1.0, 0.0], [0.0, 1.0]) == math.inf


def test_top1_counts_argmax_disagreements() -> None:
    ref = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]]).log()
    cand = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.2, 0.3, 0.5]]).log()
    assert top1_matches(ref, cand).tolist() == [True, False, True]


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert percentile([3.0], 99) == 3.0


def test_a_candidate_equal_to_the_reference_changes_nothing_and_passes() -> None:
    lps = [math.log(0.25)] * 10
    fig = judge(compare("same", "itself", perplexity(lps), lps, [0.0] * 10, [True] * 10, 1.0), Thresholds())
    assert fig.ppl_change == pytest.approx(0.0, abs=1e-12)
    assert (fig.mean_kl, fig.p99_kl, fig.top1) == (0.0, 0.0, 1.0)
    assert fig.passed


def test_relative_change() -> None:
    assert relative_change(102.0, 100.0) == pytest.approx(0.02)
    assert relative_change(98.0, 100.0) == pytest.approx(-0.02)


def _fig(name: str, change: float = 0.0, kl: float = 0.0, p99: float = 0.0, top1: float = 1.0) -> Figures:
    return judge(
        Figures(name, name, 100, 10.0, 1.0, ppl_change=change, mean_kl=kl, p99_kl=p99, top1=top1),
        Thresholds(),
    )


def test_each_broken_limit_is_named_with_its_figure_and_limit() -> None:
    fig = _fig("nf4", change=0.05, kl=0.2, p99=2.0, top1=0.5)
    assert len(fig.failures) == 4
    assert "perplexity change +5.00% is above the limit +2.00%" in fig.failures
    assert any(f.startswith("top-1 agreement 50.0% is below") for f in fig.failures)
    assert _fig("int8", change=0.0199).passed


def test_verdict_names_the_smallest_passing_candidate() -> None:
    v = verdict([_fig("int8"), _fig("nf4"), _fig("fp8")])
    assert (v.go, v.use) == (True, "nf4")
    v = verdict([_fig("int8"), _fig("nf4", change=0.5)])
    assert (v.go, v.use) == (True, "int8")
    v = verdict([_fig("int8", kl=1.0), _fig("nf4", kl=1.0)])
    assert (v.go, v.use) == (False, None) and "full precision" in v.reason


def test_verdict_for_a_planned_quantization_is_about_that_one() -> None:
    v = verdict([_fig("int8"), _fig("nf4", change=0.1)], planned="nf4")
    assert not v.go and v.use == "int8" and "nf4 fails" in v.reason and "int8 passes" in v.reason
    v = verdict([_fig("int8", top1=0.1), _fig("nf4", change=0.1)], planned="nf4")
    assert not v.go and v.use is None and "method: lora" in v.reason
    v = verdict([_fig("int8"), _fig("nf4")], planned="nf4")
    assert (v.go, v.use) == (True, "nf4")
    assert not verdict([_fig("int8")], planned="nf4").go  # not measured is not a go


def test_top1_is_not_judged_against_a_near_uniform_reference() -> None:
    assert near_uniform(perplexity([-math.log(512)] * 5), 512)  # a uniform model
    assert not near_uniform(3.0, 512)
    flat = Figures("nf4", "nf4", 100, 10.0, 1.0, ppl_change=0.0, mean_kl=0.0, p99_kl=0.0, top1=0.5)
    assert judge(flat, Thresholds(), top1=False).passed
    assert not judge(flat, Thresholds()).passed

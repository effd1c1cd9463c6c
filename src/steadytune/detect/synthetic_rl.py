"""Seeded RL and preference runs, batch by batch, healthy or with one trouble, for the tests.

A GRPO batch is ``groups`` prompt groups of ``group_size`` completions each, scored by
a reward (binary, or graded in thirds); a group whose completions all earn the same
reward has no advantages. A DPO batch is ``batch`` preference pairs whose implicit
reward margins widen as the policy learns. Each function returns what a trainer logs
per step: the loss, the gradient norm, and the other fields under TRL's names, so a
test builds its records from them (``tests/unit/detect/helpers.py``).

The troubles are the ones RL and preference users meet (docs/detectors.md):

- ``dead``: the reward function never fires (GRPO) or the policy never moves (DPO:
  a frozen model, or an LR of 0): no update carries anything;
- ``collapse``: the policy collapses into degenerate output (gibberish: the entropy
  runs away; or silence: the completions shrink to a token) and the reward falls to
  its floor within a few steps and stays there;
- ``kl_runaway``: the KL to the reference grows a hundredfold and more while the
  reward does not improve;
- ``clip``: most tokens' probability ratios leave the clip range (the update is
  clipped away);
- ``pinned``: the policy emits one answer that scores the same on every prompt (a
  fixed completion, every completion cut at the length limit), somewhere between the
  reward's floor and its top; now and then a batch strays, and its strays score
  lower. Most batches tie at that one value, the reward does not rise;
- ``flat``: the policy never improves: its chance of a right answer stays where it
  began for the whole run, its groups tie and differ as before, so nothing in any
  window is exact (a reward it cannot learn from at its LR, a task beyond it);
- ``nan`` (DPO): the logged rewards and log-probabilities turn NaN while the loss
  stays finite.
- ``swapped`` (DPO): chosen and rejected swapped in the data (or a sign error): the
  margins grow the wrong way, below 0, and the loss rises above ln 2;
- ``unlearned`` (DPO): the policy moves but not towards the preferences (labels that
  are noise): the margins spread around 0, their mean stays there, and the loss
  settles above ln 2;
- ``collapse`` (DPO, at ``at``): a policy that had learned the preferences loses them (an
  LR blow-up, a degenerate policy): from ``at`` on, the margins' mean is back at 0 with
  their spread unchanged.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Any, NamedTuple

RL_TROUBLES = ("dead", "collapse", "kl_runaway", "clip", "pinned", "flat")
DPO_TROUBLES = ("dead", "frozen_lr0", "nan", "swapped", "unlearned", "collapse")

Batches = tuple[list[float], list[float | None], list[dict[str, Any]]]


def grpo_batches(
    rng: random.Random, n: int, groups: int, beta: float, share_field: bool, g0: float = 0.3
) -> Batches:
    """GRPO, batch by batch: (losses, grad norms, logged fields).

    The share of prompt groups whose completions all earn the same reward falls from 3/4 to 1/3
    as the policy learns. A batch in which every group tied has no advantages, so its gradient
    is the KL term's alone (``beta`` times a small drift; exactly 0 at beta 0). The loss sits
    near zero. ``share_field``: the records carry TRL's ``frac_reward_zero_std``.
    """
    losses: list[float] = []
    grads: list[float | None] = []
    extra: list[dict[str, Any]] = []
    for i in range(n):
        t = i / n
        tied = 0.75 - 0.45 * (1 - math.exp(-6 * t))
        learning = sum(rng.random() > tied for _ in range(groups))
        kl = 0.03 * (1 - math.exp(-i / (0.15 * n))) * math.exp(rng.gauss(0, 0.5)) if i else 0.0
        if learning:
            grads.append(g0 * math.sqrt(learning / groups) * math.exp(rng.gauss(0, 0.4)))
        else:
            grads.append(beta * g0 * math.exp(rng.gauss(0, 0.3)))
        losses.append(abs(rng.gauss(0, 0.01)) * math.sqrt(learning / groups) + beta * kl + 1e-6)
        rec: dict[str, Any] = {
            "reward": 0.15 + 0.55 * (1 - math.exp(-5 * t)) + rng.gauss(0, 0.08),
            "reward_std": 0.3 if learning or groups > 1 else 0.0,
        }
        if share_field:
            rec["frac_reward_zero_std"] = 1 - learning / groups
        if beta:
            rec["kl"] = max(kl, 1e-6) if i else 0.0
        extra.append(rec)
    return losses, grads, extra


def rl_run(
    rng: random.Random,
    n: int,
    *,
    groups: int = 4,
    group_size: int = 8,
    beta: float = 0.04,
    graded: bool = False,
    share_field: bool = True,
    on_policy: bool = True,
    rare: bool = False,
    trouble: str | None = None,
    at: int = 0,
) -> Batches:
    """A GRPO run whose completions are drawn one by one: (losses, grad norms, logged fields).

    The policy's chance of a right answer rises from ``p0`` to ``p1``; each prompt group has a
    difficulty of its own (a logit offset), so some groups tie while others learn. A tied group
    has no advantages. The gradient of a batch is its learning groups' (scaled by their share)
    plus the KL term's (``beta`` times the drift). ``rare``: a reward that fires on a few
    completions in a hundred at first and rises slowly (most groups tie at the floor for a long
    while). ``trouble`` starts at point ``at`` (:data:`RL_TROUBLES`; ``dead`` and ``flat`` from the start).
    """
    p0, p1 = rng.uniform(0.1, 0.35), rng.uniform(0.45, 0.9)
    tau = rng.uniform(0.1, 0.5) * n
    if rare:
        p0, p1, tau = rng.uniform(0.02, 0.08), rng.uniform(0.15, 0.4), rng.uniform(0.5, 1.5) * n
    if trouble == "flat":
        p1 = p0
    # What the one answer of a ``pinned`` policy scores, and how often its batch strays.
    pinned, strays = (rng.uniform(0.2, 0.8), rng.uniform(0.1, 0.35)) if trouble == "pinned" else (0.0, 0.0)
    spread = rng.uniform(0.0, 1.5)  # how much the prompts' difficulties differ (logit sd)
    g0 = rng.uniform(0.05, 2.0)
    kl_end = rng.uniform(0.005, 0.1)
    ent0, ent_end = rng.uniform(0.2, 1.5), rng.uniform(0.4, 0.9)
    len0, len_end, max_len = rng.uniform(40, 600), rng.uniform(0.6, 1.5), 1024.0
    clip0 = 0.0 if on_policy else rng.uniform(0.001, 0.05)
    losses: list[float] = []
    grads: list[float | None] = []
    extra: list[dict[str, Any]] = []
    floor = None
    for i in range(n):
        t = 1 - math.exp(-i / tau)
        p = p0 + (p1 - p0) * t
        kl = kl_end * (1 - math.exp(-i / (0.15 * n))) * math.exp(rng.gauss(0, 0.3)) if i else 0.0
        entropy = ent0 * (1 + (ent_end - 1) * t) * math.exp(rng.gauss(0, 0.05))
        length = min(max_len, len0 * (1 + (len_end - 1) * t) * math.exp(rng.gauss(0, 0.05)))
        clip = clip0 * math.exp(rng.gauss(0, 0.3))
        p, kl, entropy, length, clip, floor = _troubled(
            rng, trouble, i - at, _Point(p, kl, entropy, length, clip), ent0, max_len, floor
        )
        if trouble == "pinned" and i >= at:
            rewards, tied = _pinned_groups(rng, pinned, strays, groups, group_size)
        else:
            rewards, tied = _groups(rng, p, groups, group_size, spread, graded)
        learning = groups - tied
        if learning:
            g = g0 * math.sqrt(learning / groups) * math.exp(rng.gauss(0, 0.3))
        else:
            g = 0.0
        g += beta * g0 * 10 * kl * math.exp(rng.gauss(0, 0.3))
        grads.append(g)
        flat = [r for grp in rewards for r in grp]
        losses.append(rng.gauss(0, 0.01) * math.sqrt(learning / groups) + beta * kl)
        rec: dict[str, Any] = {
            "reward": statistics.fmean(flat),
            "reward_std": statistics.pstdev(flat),  # TRL's: the spread of the whole batch
            "entropy": entropy,
            "completions/mean_length": length,
            "clip_ratio/region_mean": clip,
        }
        if share_field:
            rec["frac_reward_zero_std"] = tied / groups
        if beta:
            rec["kl"] = kl
        extra.append(rec)
    return losses, grads, extra


class _Point(NamedTuple):
    p: float  # the chance of a right answer
    kl: float
    entropy: float
    length: float
    clip: float


def _troubled(
    rng: random.Random,
    trouble: str | None,
    since: int,
    pt: _Point,
    ent0: float,
    max_len: float,
    floor: str | None,
) -> tuple[float, float, float, float, float, str | None]:
    """The point as ``trouble`` leaves it, ``since`` points after it began (the point unchanged
    before then), and the floor a collapse falls to (chosen once: gibberish or silence)."""
    p, kl, entropy, length, clip = pt
    if trouble == "dead":
        p, kl, entropy = 0.0, 0.0, ent0 * math.exp(rng.gauss(0, 0.02))
    elif trouble == "collapse" and since >= 0:
        fall = min(1.0, (since + 1) / 3)
        p *= 1 - fall
        kl *= 1 + 30 * fall
        if floor is None:
            floor = rng.choice(["gibberish", "silence"])
        if floor == "gibberish":
            entropy *= 1 + 20 * fall
            length = max_len
        else:
            length = max(1.0, length * (1 - fall))
    elif trouble == "kl_runaway" and since >= 0:
        kl = max(kl, 1e-3) * math.exp(since * math.log(1000) / 40)
        p = max(0.0, p - 0.002 * since)
        entropy *= 1 + since / 40
    elif trouble == "clip" and since >= 0:
        clip = min(0.95, rng.uniform(0.4, 0.8) * math.exp(rng.gauss(0, 0.1)))
    return p, kl, entropy, length, clip, floor


def _groups(
    rng: random.Random, p: float, groups: int, size: int, spread: float, graded: bool
) -> tuple[list[list[float]], int]:
    """Each group's rewards, and how many groups tied."""
    logit = math.log(max(p, 1e-9) / max(1 - p, 1e-9))
    out, tied = [], 0
    for _ in range(groups):
        q = 1 / (1 + math.exp(-(logit + rng.gauss(0, spread)))) if 0 < p < 1 else p
        if graded:
            grp = [(rng.random() < q) * 0.5 + (rng.random() < q) * 0.5 for _ in range(size)]
        else:
            grp = [float(rng.random() < q) for _ in range(size)]
        tied += len(set(grp)) == 1
        out.append(grp)
    return out, tied


def _pinned_groups(
    rng: random.Random, value: float, strays: float, groups: int, size: int
) -> tuple[list[list[float]], int]:
    """A batch of a policy that emits one answer scoring ``value``: every group ties at it, but for a
    batch that strays (chance ``strays``), where some groups' completions score lower."""
    out = [[value] * size for _ in range(groups)]
    if rng.random() < strays:
        for grp in rng.sample(out, rng.randint(1, groups)):
            for j in rng.sample(range(size), rng.randint(1, size)):
                grp[j] = value * rng.uniform(0.0, 0.9)
    return out, sum(len(set(grp)) == 1 for grp in out)


def dpo_run(
    rng: random.Random,
    n: int,
    *,
    batch: int = 8,
    beta: float = 0.1,
    trouble: str | None = None,
    at: int = 0,
) -> tuple[list[float], list[float | None], list[float], list[dict[str, Any]]]:
    """DPO, batch by batch: (losses, grad norms, LRs, logged fields under TRL's names).

    Each pair's implicit reward margin is drawn around a mean that grows from 0 (the policy is
    its reference at the first step: every margin exactly 0, the loss exactly ln 2) with a spread
    that grows too; the chosen rewards drift down while the rejected ones fall faster, as real
    DPO runs show. ``trouble``: :data:`DPO_TROUBLES` (``dead``, ``frozen_lr0``, ``swapped`` and
    ``unlearned`` from the start, ``collapse`` and ``nan`` at ``at``).
    """
    m_end, s_end = rng.uniform(0.5, 4.0), rng.uniform(0.5, 2.0)
    if trouble == "swapped":
        m_end = -m_end
    elif trouble == "unlearned":
        m_end = 0.0
    tau = rng.uniform(0.1, 0.4) * n
    g0 = rng.uniform(0.3, 10.0)
    lr0 = rng.choice([5e-7, 1e-6, 5e-6, 1e-5])
    logp_c, logp_r = rng.uniform(-400, -50), rng.uniform(-400, -50)
    losses: list[float] = []
    grads: list[float | None] = []
    lrs: list[float] = []
    extra: list[dict[str, Any]] = []
    for i in range(n):
        t = 1 - math.exp(-i / tau)
        lr = lr0 * (1 - i / n)
        g = g0 * (1 + 2 * math.exp(-i / 5)) * math.exp(rng.gauss(0, 0.3))
        moved = i > 0 and trouble not in ("dead", "frozen_lr0")
        if trouble == "dead":
            g = 0.0
        elif trouble == "frozen_lr0":
            lr = 0.0
        chosen_drift = -0.3 * m_end * t * rng.uniform(0, 1)
        pairs = []
        for _ in range(batch):
            mean = 0.0 if trouble == "collapse" and i >= at else m_end * t
            margin = rng.gauss(mean, 0.05 + s_end * t) if moved else 0.0
            chosen = rng.gauss(chosen_drift, 0.2 * t) if moved else 0.0
            pairs.append((chosen, chosen - margin))
        margins = [c - r for c, r in pairs]
        rec: dict[str, Any] = {
            "rewards/chosen": statistics.fmean(c for c, _ in pairs),
            "rewards/rejected": statistics.fmean(r for _, r in pairs),
            "rewards/margins": statistics.fmean(margins),
            "rewards/accuracies": statistics.fmean(float(m > 0) for m in margins),
            "logps/chosen": logp_c + statistics.fmean(c for c, _ in pairs) / beta,
            "logps/rejected": logp_r + statistics.fmean(r for _, r in pairs) / beta,
        }
        if trouble == "nan" and at <= i < at + 2:
            for k in ("rewards/chosen", "rewards/margins", "logps/chosen"):
                rec[k] = math.nan
        losses.append(statistics.fmean(math.log1p(math.exp(-m)) for m in margins))
        grads.append(g)
        lrs.append(lr)
        extra.append(rec)
    return losses, grads, lrs, extra

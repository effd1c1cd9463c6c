"""Generated shapes of troubles real logs show, written in the formats people log them in, through analyze.

    python benchmarks/detection_shapes.py [--seeds N] [--only SHAPE]

Each shape is a run (healthy, or with one trouble at known points) drawn over its variants
(length, noise, scale, logging interval). Each variant is written as an HF trainer_state.json
(``hf``), a TRL/HF stdout of printed dicts (``trl``), a plain ``[step N] k=v`` text log
(``text``), a LLaMA-Factory trainer_log.jsonl (``lf``, with only the fields LLaMA-Factory
writes: no grad norm, no KL) and a verl console (``verl``), and read back by ``steadytune
analyze``'s own entry (``cli.analyze.analyze_path``), so the readers are judged with the rules.

A cell counts the variants: ``ok`` (the expected kind, one episode, nothing else; for a
silent shape: nothing), ``miss``, ``kind`` (an alarm of another kind only), ``extra``
(caught, with more episodes or other alarms beside it), ``fa`` (an alarm on a silent shape),
``fmt`` (read as another format than the one written) and ``err`` (unreadable). A format
that cannot carry the shape's evidence is ``n/a``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steadytune.cli.analyze import analyze_path
from steadytune.config.detect import DetectConfig

Row = dict[str, Any]  # one logged point: "step" and canonical fields (None: not logged)


@dataclass
class Shape:
    """One generated run: its rows, the kinds that tell its trouble ([] for a healthy run), where."""

    rows: list[Row]
    expect: tuple[str, ...] = ()
    at: list[int] = field(default_factory=list)  # injected steps (spikes), each to be caught
    rl: bool = False
    extra_lines: dict[int, str] = field(default_factory=dict)  # step -> an artefact field logged alone


# ---------------------------------------------------------------- shapes


def _ln(rng: random.Random, sigma: float) -> float:
    return math.exp(rng.gauss(0.0, sigma))


def dpo_avg_artefact(rng: random.Random, n: int, noise: float) -> Shape:
    """(a) A DPO loop printing its loss every step and ``avg_loss=0.0000`` every tenth: healthy."""
    rows = []
    for s in range(1, n + 1):
        loss = (0.35 + (math.log(2) - 0.35) * math.exp(-s / (n / 4))) * _ln(rng, noise)
        rows.append({"step": s, "loss": loss, "lr": 5e-7, "grad_norm": 3.0 * _ln(rng, 0.3)})
    return Shape(rows, extra_lines={s: "avg_loss" for s in range(10, n + 1, 10)})


def negative_objective(rng: random.Random, n: int, noise: float) -> Shape:
    """(b) A distillation / policy-gradient objective negative by construction, -0.03 to -0.015: healthy."""
    rows = []
    for s in range(1, n + 1):
        loss = -(0.015 + 0.015 * math.exp(-s / (n / 3))) * (1 + rng.gauss(0.0, noise))
        rows.append({"step": s, "loss": loss, "lr": 1e-6, "grad_norm": 0.2 * _ln(rng, 0.3)})
    return Shape(rows)


def grpo_no_signal(rng: random.Random, n: int, noise: float) -> Shape:
    """(c) GRPO whose reward is 0 at most steps and never improves, grad norm ~1e-3."""
    rows = []
    for s in range(1, n + 1):
        hit = rng.random() < 0.1
        reward = rng.choice((1, 2)) / 16 if hit else 0.0
        rows.append(
            {
                "step": s, "loss": 1e-5 * rng.gauss(0, 1) if hit else 0.0, "lr": 1e-6,
                "grad_norm": 1e-3 * _ln(rng, noise), "reward": reward,
                "reward_std": 0.2 if hit else 0.0, "kl": 1e-4 * _ln(rng, 0.3),
                "entropy": 0.4 * _ln(rng, 0.05),
            }
        )  # fmt: skip
    return Shape(rows, expect=("no_learning_signal",), at=[1], rl=True)


def grpo_dead(rng: random.Random, n: int, noise: float) -> Shape:
    """(c) Loss, reward, KL and grad norm exactly 0 from the first step: a dead run."""
    rows = [
        {"step": s, "loss": 0.0, "lr": 1e-6, "grad_norm": 0.0, "reward": 0.0, "reward_std": 0.0,
         "kl": 0.0, "entropy": 0.5 * _ln(rng, noise)}
        for s in range(1, n + 1)
    ]  # fmt: skip
    return Shape(rows, expect=("no_learning_signal",), at=[1], rl=True)


def grpo_reward_collapse(rng: random.Random, n: int, noise: float) -> Shape:
    """(c) Reward ~1.0 falls to 0 within a few logs, entropy 0.15 -> 7, grad norm exactly 0 after."""
    at = int(n * 0.6)
    rows = []
    for s in range(1, n + 1):
        if s < at:
            reward, ent, g = (
                min(1.0, 0.95 + rng.gauss(0, noise / 4)),
                0.15 * _ln(rng, 0.1),
                0.05 * _ln(rng, 0.3),
            )
        else:
            k = s - at
            reward = max(0.0, 1.0 - 0.4 * (k + 1)) if k < 3 else 0.0
            ent, g = min(7.0, 0.15 * 3.6 ** (k + 1)) * _ln(rng, 0.02), 0.0 if k >= 2 else 0.05
        std = 0.0 if reward in (0.0, 1.0) else 0.3
        rows.append(
            {"step": s, "loss": 0.0 if g == 0.0 else 0.01 * rng.gauss(0, 1), "lr": 1e-6, "grad_norm": g,
             "reward": reward, "reward_std": std, "kl": 0.002 * _ln(rng, 0.2), "entropy": ent}
        )  # fmt: skip
    return Shape(rows, expect=("reward_collapse",), at=[at], rl=True)


def sft_zero_grad(rng: random.Random, n: int, noise: float) -> Shape:
    """(c) An SFT run whose grad norm is exactly 0 at every log, its loss flat: no update is happening."""
    rows = [
        {"step": s, "loss": 1.9 * _ln(rng, noise), "lr": 2e-5, "grad_norm": 0.0, "epoch": s / n}
        for s in range(1, n + 1)
    ]
    return Shape(rows, expect=("no_learning_signal",), at=[1])


def sft_zero_grad_zero_loss(rng: random.Random, n: int, noise: float) -> Shape:
    """(c) An SFT run whose loss and grad norm are exactly 0 at every log."""
    rows = [{"step": s, "loss": 0.0, "lr": 2e-5, "grad_norm": 0.0, "epoch": s / n} for s in range(1, n + 1)]
    return Shape(rows, expect=("no_learning_signal",), at=[1])


def short_grad_spikes(rng: random.Random, n: int, noise: float) -> Shape:
    """(d) A short SFT run (< 100 points) with grad-norm jumps of 8-120x its neighbours, one in warm-up."""
    warm = max(3, n // 10)
    at = sorted({rng.randint(3, warm + 2), rng.randint(warm + 5, n // 2), rng.randint(n // 2 + 3, n - 3)})
    rows = []
    for s in range(1, n + 1):
        loss = (0.9 + 1.3 * math.exp(-s / (n / 3))) * _ln(rng, 0.04)
        lr = 2e-4 * min(1.0, s / warm)
        g = (2.0 if s <= warm else 0.8) * _ln(rng, noise)
        rows.append({"step": s, "loss": loss, "lr": lr, "grad_norm": g, "epoch": 3 * s / n})
    for s in at:  # a jump over both of its neighbours, as the logs show it
        rows[s - 1]["grad_norm"] = rng.choice((9, 15, 30, 120)) * max(
            rows[s - 2]["grad_norm"], rows[s]["grad_norm"]
        )
    return Shape(rows, expect=("grad_spike", "grad_explosion"), at=at)


def memorizing_bursts(rng: random.Random, n: int, noise: float) -> Shape:
    """(d) A multi-epoch run memorizing its data, with two bursts of 10x grad norms over 2-3 points."""
    at = [int(n * 0.45), int(n * 0.8)]
    rows = []
    for s in range(1, n + 1):
        loss = (0.02 + 2.0 * math.exp(-s / (n / 5))) * _ln(rng, 0.05)
        g = (0.15 + 1.2 * math.exp(-s / (n / 5))) * _ln(rng, noise)
        if any(a <= s < a + 3 for a in at):
            g *= 10.0
        rows.append({"step": s, "loss": loss, "lr": 1e-4, "grad_norm": g, "epoch": 10 * s / n})
    return Shape(rows, expect=("grad_spike", "grad_explosion"), at=at)


def coarse_overfit(rng: random.Random, n: int, noise: float) -> Shape:
    """(e) Logged every 500 steps: the eval loss falls, then creeps up over thousands of steps."""
    best = n // 3
    rows = []
    for i in range(1, n + 1):
        s = 500 * i
        loss = (0.6 + 1.4 * math.exp(-i / (n / 4))) * _ln(rng, 0.02)
        ev = 1.4 + 0.8 * math.exp(-i / (best / 3)) if i <= best else 1.4 * (1 + 0.02 * (i - best))
        rows.append({"step": s, "loss": loss, "lr": 1e-5, "grad_norm": 0.7 * _ln(rng, 0.1),
                     "eval_loss": ev * _ln(rng, noise / 4), "epoch": 4 * i / n})  # fmt: skip
    return Shape(rows, expect=("overfitting",), at=[500 * (best + 3)])


def coarse_collapse(rng: random.Random, n: int, noise: float) -> Shape:
    """(e) A long multi-epoch run logged every 500 steps whose loss collapses to near zero."""
    at = int(n * 0.6)
    rows = []
    for i in range(1, n + 1):
        s = 500 * i
        level = 1.2 + 0.8 * math.exp(-i / (n / 6))
        if i >= at:
            level *= max(0.0008, 0.08 ** (i - at + 1))
        rows.append({"step": s, "loss": level * _ln(rng, noise), "lr": 1e-5,
                     "grad_norm": 0.5 * _ln(rng, 0.1), "epoch": 8 * i / n})  # fmt: skip
    return Shape(rows, expect=("loss_collapse",), at=[500 * at])


def healthy_grpo(rng: random.Random, n: int, noise: float) -> Shape:
    """A control: a GRPO run that learns (reward 0.2 -> 0.7, groups partly tied)."""
    rows = []
    for s in range(1, n + 1):
        p = 0.2 + 0.5 * (1 - math.exp(-s / (n / 3)))
        reward = sum(rng.random() < p for _ in range(64)) / 64
        rows.append(
            {"step": s, "loss": 0.02 * rng.gauss(0, 1), "lr": 1e-6, "grad_norm": 0.3 * _ln(rng, noise),
             "reward": reward, "reward_std": 0.35 * _ln(rng, 0.05), "kl": 0.001 * s**0.5 * _ln(rng, 0.2),
             "entropy": 0.4 * _ln(rng, 0.05)}
        )  # fmt: skip
    return Shape(rows, rl=True)


def healthy_short_sft(rng: random.Random, n: int, noise: float) -> Shape:
    """A control: a short SFT run with a warm-up and a noisy grad norm, no spike."""
    warm = max(3, n // 10)
    rows = []
    for s in range(1, n + 1):
        g = (2.0 if s <= warm else 0.8) * _ln(rng, noise)
        loss = (0.9 + 1.3 * math.exp(-s / (n / 3))) * _ln(rng, 0.04)
        rows.append(
            {"step": s, "loss": loss, "lr": 2e-4 * min(1.0, s / warm), "grad_norm": g, "epoch": s / n}
        )
    return Shape(rows)


# name -> (generator, variants of (points, noise))
SHAPES: dict[str, tuple[Callable[[random.Random, int, float], Shape], list[tuple[int, float]]]] = {
    "a dpo avg_loss artefact": (dpo_avg_artefact, [(60, 0.03), (300, 0.05), (1000, 0.1)]),
    "b negative objective": (negative_objective, [(40, 0.05), (200, 0.1), (800, 0.2)]),
    "c grpo no signal": (grpo_no_signal, [(40, 0.2), (150, 0.3), (500, 0.5)]),
    "c dead run": (grpo_dead, [(20, 0.02), (100, 0.05), (400, 0.05)]),
    "c reward collapse": (grpo_reward_collapse, [(20, 0.1), (60, 0.2), (200, 0.2)]),
    "c sft grad 0": (sft_zero_grad, [(20, 0.02), (100, 0.05), (400, 0.1)]),
    "c sft grad 0 loss 0": (sft_zero_grad_zero_loss, [(20, 0.0), (100, 0.0)]),
    "d short grad spikes": (short_grad_spikes, [(30, 0.15), (60, 0.25), (95, 0.35)]),
    "d memorizing bursts": (memorizing_bursts, [(100, 0.1), (300, 0.2), (600, 0.3)]),
    "e coarse overfit": (coarse_overfit, [(15, 0.02), (30, 0.04), (60, 0.04)]),
    "e coarse collapse": (coarse_collapse, [(20, 0.03), (50, 0.05), (120, 0.05)]),
    "control healthy grpo": (healthy_grpo, [(40, 0.2), (200, 0.3), (800, 0.4)]),
    "control short sft": (healthy_short_sft, [(30, 0.15), (60, 0.25), (95, 0.35)]),
}

# ---------------------------------------------------------------- formats

HF = {"loss": "loss", "grad_norm": "grad_norm", "lr": "learning_rate", "epoch": "epoch", "reward": "reward",
      "reward_std": "reward_std", "kl": "kl", "entropy": "entropy"}  # fmt: skip
VERL = {"loss": "actor/pg_loss", "grad_norm": "actor/grad_norm", "lr": "actor/lr",
        "reward": "critic/score/mean", "kl": "actor/kl_loss", "entropy": "actor/entropy"}  # fmt: skip
VERL_SFT = {"loss": "train/loss", "grad_norm": "train/grad_norm", "lr": "train/lr", "eval_loss": "val/loss"}
LF = {
    "loss": "loss",
    "lr": "lr",
    "epoch": "epoch",
    "reward": "reward",
}  # what LLaMA-Factory's callback writes


def _fields(row: Row, names: dict[str, str]) -> Row:
    return {names[k]: v for k, v in row.items() if k in names and v is not None}


def write_hf(shape: Shape, path: Path) -> Path | None:
    hist: list[Row] = []
    for r in shape.rows:
        hist.append({**_fields(r, HF), "step": r["step"]})
        if r.get("eval_loss") is not None:
            hist.append({"eval_loss": r["eval_loss"], "epoch": r.get("epoch"), "step": r["step"]})
        if r["step"] in shape.extra_lines:
            hist.append({shape.extra_lines[r["step"]]: 0.0, "step": r["step"]})
    path = path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": shape.rows[-1]["step"], "log_history": hist}))
    return path


def write_trl(shape: Shape, path: Path) -> Path | None:
    total = shape.rows[-1]["step"]
    lines = []
    for r in shape.rows:
        lines.append(f"{r['step'] * 100 // total}%|###| {r['step']}/{total} [00:10<00:10, 1.00it/s]")
        lines.append(repr({**_fields(r, HF), "epoch": r.get("epoch", r["step"] / total)}))
        if r.get("eval_loss") is not None:
            lines.append(repr({"eval_loss": r["eval_loss"], "eval_runtime": 1.0, "epoch": r.get("epoch")}))
        if r["step"] in shape.extra_lines:
            lines.append(repr({shape.extra_lines[r["step"]]: 0.0}))
    path = path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_text(shape: Shape, path: Path) -> Path | None:
    lines = []
    for r in shape.rows:
        kv = " ".join(f"{k}={v:.6g}" for k, v in _fields(r, HF).items() if k != "epoch")
        lines.append(f"[step {r['step']}] {kv}")
        if r.get("eval_loss") is not None:
            lines.append(f"[step {r['step']}] eval_loss={r['eval_loss']:.4f}")
        if r["step"] in shape.extra_lines:
            lines.append(f"[step {r['step']}] {shape.extra_lines[r['step']]}=0.0000")
    path = path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_lf(shape: Shape, path: Path) -> Path | None:
    if shape.rl or "grad_spike" in shape.expect or "no_learning_signal" in shape.expect:
        return None  # LLaMA-Factory writes no grad norm, KL or reward spread: nothing to tell these by
    total = shape.rows[-1]["step"]
    lines = []
    for r in shape.rows:
        row = {"current_steps": r["step"], "total_steps": total, **_fields(r, LF)}
        row.setdefault("epoch", round(r["step"] / total, 2))
        row.update(
            percentage=round(100 * r["step"] / total, 2), elapsed_time="0:00:10", remaining_time="0:00:10"
        )
        lines.append(json.dumps(row))
        if r.get("eval_loss") is not None:
            ev = {**row, "eval_loss": r["eval_loss"]}
            lines.append(json.dumps({k: v for k, v in ev.items() if k not in ("loss", "lr")}))
    path = path / "trainer_log.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_verl(shape: Shape, path: Path) -> Path | None:
    names = VERL if shape.rl else VERL_SFT
    lines = []
    for r in shape.rows:
        row = _fields(r, names)
        if "reward_std" in r and shape.rl:  # verl logs the advantages' range, not the reward's spread
            row["critic/advantages/max"] = 1.5 if r["reward_std"] else 0.0
            row["critic/advantages/min"] = -1.5 if r["reward_std"] else 0.0
        if r.get("eval_loss") is not None:
            row["val/loss"] = r["eval_loss"]
        if r["step"] in shape.extra_lines:
            row[shape.extra_lines[r["step"]]] = 0.0
        lines.append(f"step:{r['step']} - " + " - ".join(f"{k}:{v:.6g}" for k, v in row.items()))
    path = path / "verl.log"
    path.write_text("\n".join(lines) + "\n")
    return path


READ_AS = {"hf": "hf_trainer_state", "trl": "dict_log", "text": "text_log", "lf": "llamafactory_trainer_log",
           "verl": "dict_log"}  # fmt: skip
FORMATS: dict[str, Callable[[Shape, Path], Path | None]] = {
    "hf": write_hf, "trl": write_trl, "text": write_text, "lf": write_lf, "verl": write_verl,
}  # fmt: skip

# ---------------------------------------------------------------- judging


def judge(shape: Shape, result: Any, interval: int, fmt_name: str) -> tuple[str, str]:
    """The cell's verdict for one variant, and a short note of what was raised."""
    if result.error is not None:
        return "err", result.error[:60]
    if result.format != fmt_name:
        return "fmt", result.format
    got = [a for a in result.anomalies if a.severity != "info"]
    note = ",".join(f"{a.kind}@{a.start_step}" for a in got[:4]) + ("..." if len(got) > 4 else "")
    if not shape.expect:
        return ("fa" if got else "ok"), note
    hits = [a for a in got if a.kind in shape.expect]
    if not hits:
        return ("kind" if got else "miss"), note
    if len(shape.at) > 1:  # each injected point must be caught by an episode spanning it
        slack = 2 * interval
        caught = sum(any(a.start_step - slack <= s <= a.end_step + slack for a in hits) for s in shape.at)
        if caught < len(shape.at):
            return "miss", f"{caught}/{len(shape.at)} " + note
    return ("ok" if len(got) == len(hits) and len(hits) <= len(shape.at) else "extra"), note


def audit(names: list[str], seeds: int, verbose: bool) -> dict[tuple[str, str], Counter[str]]:
    table: dict[tuple[str, str], Counter[str]] = {}
    config = DetectConfig()
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            gen, variants = SHAPES[name]
            for fmt, write in FORMATS.items():
                cell: Counter[str] = Counter()
                for seed in range(seeds):
                    for n, noise in variants:
                        shape = gen(random.Random(zlib.crc32(f"{name} {seed} {n}".encode())), n, noise)
                        d = Path(tmp) / f"{names.index(name)}-{fmt}-{seed}-{n}"
                        d.mkdir()
                        path = write(shape, d)
                        if path is None:
                            cell["n/a"] += 1
                            continue
                        interval = shape.rows[1]["step"] - shape.rows[0]["step"]
                        verdict, note = judge(shape, analyze_path(str(path), config), interval, READ_AS[fmt])
                        cell[verdict] += 1
                        if verbose and verdict != "ok":
                            print(f"  {name} | {fmt} | n={n} noise={noise} seed={seed}: {verdict} {note}")
                table[(name, fmt)] = cell
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--only", action="append", help="a shape name's prefix (repeatable)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every variant that is not ok")
    args = ap.parse_args()
    names = [s for s in SHAPES if not args.only or any(s.startswith(p) for p in args.only)]
    table = audit(names, args.seeds, args.verbose)
    print("| shape | " + " | ".join(FORMATS) + " |")
    print("|---|" + "---|" * len(FORMATS))
    for name in names:
        cells = []
        for fmt in FORMATS:
            c = table[(name, fmt)]
            if set(c) == {"n/a"}:
                cells.append("n/a")
                continue
            runs = sum(v for k, v in c.items() if k != "n/a")
            rest = " ".join(f"{k} {v}" for k, v in sorted(c.items()) if k not in ("ok", "n/a"))
            cells.append(f"{c['ok']}/{runs}" + (f" ({rest})" if rest else ""))
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

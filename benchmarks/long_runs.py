"""Long runs judged right: generated curves of 1M and 10M points through every detector, what each raised.

    python benchmarks/long_runs.py                                   # 1M points, every case (hours)
    python benchmarks/long_runs.py --sizes 1000000,10000000 --only healthy --shapes power_law
    python benchmarks/long_runs.py --sizes 100000 --noises 0.03      # minutes

The same shapes as ``tests/unit/detect/test_long_runs.py`` (``tests/unit/detect/long_curves.py``), at the
sizes the tests leave out. Each case is one run of ``steadytune.detect.detect`` over a generated stream (the
records are made one at a time; the detectors see them as ``analyze`` would), and prints what it raised
(warnings and criticals, kind@first step), whether that is what the case expects, and the time:

- ``healthy``: every shape, every noise level, with an LR warm-up over 1% of the run and a cosine decay:
  nothing raised;
- ``no_lr``: the shapes with no LR logged (issue 30's 1M-step curve is ``hyperbola``): nothing raised.
  ``linear`` from 100k points and ``exponential`` from 1M are printed as known limits
  (docs/detectors.md: a fall under the noise over the first few hundred steps is flat to any fit);
- ``trouble``: a spike, a divergence, an oscillation, a grad spike, a NaN and a collapse put in at 70%
  of a ``power_law`` run: each found, of an accepted kind, within its bound, and nothing before it;
- ``never_learns``: a loss flat from the first step while the LR is at its peak: a plateau, in the first
  tenth of the run.

Exit code 0 when every case met its expectation (known limits aside), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.unit.detect.long_curves import NOISES, SHAPES, TROUBLE, at, never_learns, run, severe

from steadytune.detect import detect
from steadytune.records import StepRecord

Raised = list[tuple[str, int]]


@dataclass(frozen=True)
class Case:
    """One generated run and what must come of it."""

    group: str
    name: str
    records: Callable[[int], Iterator[StepRecord]]
    judge: Callable[[int, Raised], bool]
    known_from: int | None = None  # from this many points on, a miss is a known limit (docs/detectors.md)


# Without an LR, a loss that falls less over its first ~600 steps than the noise lets be seen is flat to
# any fit of the loss: a 30% linear decline from 100,000 steps on, the exponential from 1M steps on.
_NO_LR_LIMITS = {"linear": 100_000, "exponential": 1_000_000}


def _nothing(_n: int, got: Raised) -> bool:
    return got == []


def _found(kind: str) -> Callable[[int, Raised], bool]:
    _make, accept, within = TROUBLE[kind]

    def judge(n: int, got: Raised) -> bool:
        start = at(n) + 1
        return any(k in accept and start <= s <= start + within for k, s in got) and all(
            s >= start for _, s in got
        )

    return judge


def _plateau_early(n: int, got: Raised) -> bool:
    # (a short run is judged only from plateau_min_steps on, as the unit test says)
    return [k for k, _ in got] == ["plateau"] and (n < 1000 or got[0][1] <= 0.1 * n)


def cases(shapes: list[str], noises: list[float], only: set[str]) -> list[Case]:
    out: list[Case] = []
    if "healthy" in only:
        for shape in shapes:
            for sigma in noises:
                out.append(
                    Case(
                        "healthy", f"{shape} σ{sigma}", lambda n, s=shape, g=sigma: run(s, n, g, 1), _nothing
                    )
                )
    if "no_lr" in only:
        for shape in [
            s for s in ("power_law", "converged", "exponential", "hyperbola", "linear") if s in shapes
        ]:
            out.append(
                Case(
                    "no_lr",
                    f"{shape} σ0.03",
                    lambda n, s=shape: run(s, n, 0.03, 2, warmup=0.0),
                    _nothing,
                    known_from=_NO_LR_LIMITS.get(shape),
                )
            )
    if "trouble" in only:
        for kind, (make, _accept, _within) in TROUBLE.items():
            out.append(
                Case(
                    "trouble",
                    kind,
                    lambda n, m=make: run("power_law", n, 0.01, 3, trouble=m(n)),
                    _found(kind),
                )
            )
    if "never_learns" in only:
        out.append(
            Case(
                "never_learns",
                "flat at 3.0",
                lambda n: run("linear", n, 0.01, 4, trouble=never_learns(n)),
                _plateau_early,
            )
        )
    return out


def _summary(got: Raised) -> str:
    """Each kind raised, in order of its first step: ``kind@step`` once, ``kind×count (first @step)`` more."""
    first: dict[str, int] = {}
    count: dict[str, int] = {}
    for k, s in got:
        first.setdefault(k, s)
        count[k] = count.get(k, 0) + 1
    return ", ".join(
        f"{k}@{first[k]:,}" if count[k] == 1 else f"{k}×{count[k]} (first @{first[k]:,})"
        for k in sorted(first, key=first.__getitem__)
    )


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]) if os.path.exists("/proc/loadavg") else "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000", help="points per run, comma-separated (default 1000000)")
    ap.add_argument(
        "--only", default="healthy,no_lr,trouble,never_learns", help="case groups, comma-separated"
    )
    ap.add_argument("--shapes", default=",".join(SHAPES), help="shapes for healthy and no_lr")
    ap.add_argument("--noises", default=",".join(map(str, NOISES)), help="log-noise levels for healthy")
    args = ap.parse_args(argv)
    sizes = [int(float(x)) for x in args.sizes.split(",")]
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        ap.error(f"--shapes: unknown {unknown}; choose from {sorted(SHAPES)}")
    todo = cases(shapes, [float(x) for x in args.noises.split(",")], set(args.only.split(",")))
    print(f"{len(todo)} cases x {len(sizes)} sizes; load average {_load()} at the start", flush=True)
    print(
        f"| size | group | case | raised (kind@step) | expected | s | µs/point |\n|{'---|' * 7}", flush=True
    )
    failed = 0
    for n in sizes:
        for c in todo:
            t0 = time.perf_counter()
            got = severe(detect(c.records(n)))
            dt = time.perf_counter() - t0
            ok = c.judge(n, got)
            known = c.known_from is not None and n >= c.known_from
            verdict = "yes" if ok else ("known limit" if known else "**NO**")
            failed += not ok and not known
            shown = _summary(got)
            cost = f"{dt:.1f} | {1e6 * dt / n:.0f}"
            print(f"| {n:,} | {c.group} | {c.name} | {shown or '-'} | {verdict} | {cost} |", flush=True)
    print(f"{failed} case(s) missed their expectation; load average {_load()} at the end")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

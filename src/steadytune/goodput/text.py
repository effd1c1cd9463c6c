"""The goodput account in words: the summary line and the table every front end prints.

One rendering for the run summary, ``steadytune goodput`` and the drill, so they read alike:
``goodput 91.4 % — lost: restarts 3.1 %, redone 2.0 %, saves 1.5 %, start-up 2.0 %``.
"""

from __future__ import annotations

from collections.abc import Sequence

from steadytune.goodput.parts import EVAL, LABELS, LOST, Account
from steadytune.telemetry.progress import human_seconds

SHOWN_MIN = 0.0005  # a cause under 0.05 % of the time is left out of the line (never unattributed time)


def pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f} %"


def lost_causes(acct: Account) -> list[str]:
    """The lost causes worth naming, largest first: those over 0.05 %, and any unattributed time."""
    named = [p for p in LOST if acct.share(p) >= SHOWN_MIN or (p == "unattributed" and acct.seconds[p] > 0)]
    return sorted(named, key=lambda p: -acct.seconds[p])


def lost_text(acct: Account) -> str:
    """``lost: restarts 3.1 %, redone 2.0 %; evaluation 2.0 %``: the causes, then the evaluation apart."""
    lost = ", ".join(f"{LABELS[p]} {pct(acct.share(p))}" for p in lost_causes(acct)) or "nothing"
    text = f"lost: {lost}"
    if acct.seconds[EVAL] > 0:
        text += f"; {LABELS[EVAL]} {pct(acct.share(EVAL))}"
    return text


def summary_line(acct: Account) -> str:
    """``goodput 91.4 % — lost: restarts 3.1 %, ...; evaluation 2.0 %``."""
    return f"goodput {pct(acct.goodput)} — {lost_text(acct)}"


def row_line(label: str, acct: Account, width: int = 19) -> str:
    """``kill                60.4 % of 1m01s — lost: ...``: one run of several, named."""
    return f"{label:<{width}} {pct(acct.goodput):>7} of {human_seconds(acct.wall_s)} — {lost_text(acct)}"


def table(accounts: Sequence[Account]) -> str:
    """One row per run: its wall time, goodput, and the share of every cause any of them lost time to."""
    shown = [p for p in (*LOST, EVAL) if any(a.seconds[p] > 0 for a in accounts)]
    head = ["run", "state", "wall", "goodput", *(LABELS[p] for p in shown)]
    rows = [
        [
            a.run_id,
            a.state or "live",
            human_seconds(a.wall_s),
            pct(a.goodput),
            *(pct(a.share(p)) if a.seconds[p] > 0 else "-" for p in shown),
        ]
        for a in accounts
    ]
    if len(accounts) > 1:
        rows.append(["all runs", "", human_seconds(sum(a.wall_s for a in accounts)), pct(pooled(accounts)),
                     *(pct(_pooled_share(accounts, p)) for p in shown)])  # fmt: skip
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(_cell(i, c, w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in [head, *rows]]  # fmt: skip
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(line.rstrip() for line in lines)


def _cell(column: int, text: str, width: int) -> str:
    return text.ljust(width) if column < 2 else text.rjust(width)  # names left, numbers right


def pooled(accounts: Sequence[Account]) -> float | None:
    """Goodput of several runs together: their productive time over their wall time."""
    wall = sum(a.wall_s for a in accounts)
    return sum(a.productive_s for a in accounts) / wall if wall > 0 else None


def _pooled_share(accounts: Sequence[Account], part: str) -> float | None:
    wall = sum(a.wall_s for a in accounts)
    return sum(a.seconds[part] for a in accounts) / wall if wall > 0 else None

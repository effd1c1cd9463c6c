"""``/api/goodput``: every run's goodput account, and, on a GPU server, each GPU's hours held and trained.

The accounts are the runs index's (``RunsIndex.accounts``, read incrementally), the same ones
``/metrics`` exposes, so the panel, the scrape and ``steadytune goodput`` agree. On the server
page, a GPU's *allocated* time is every stretch a job held it (from its start, through its
resizes, to its end or now); its *productive* time is the part of those stretches its job's
account calls productive.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from steadytune.goodput.parts import LABELS, LOST, PARTS, Account, Segment
from steadytune.web.runs import RunsIndex

RESIZES = ("grow", "shrink")


def runs_payload(index: RunsIndex) -> tuple[list[dict[str, Any]], int]:
    """Each run's account, oldest first (a run that cannot be read is left out, not fatal), and
    how many are left out because they are not read yet (``RunsIndex.background``: a finished run's
    account is read by the background reader, ``web/warm.py``, never by this request)."""
    out, pending = [], 0
    for entry in index.entries():
        try:
            if entry.want is not None and not entry.supervisor_live():
                acct = index.accounts.known(entry.dir)
                if acct is None:
                    entry.want(entry)
                    pending += 1
                    continue
            else:
                acct = index.accounts.account(entry.dir)
            out.append(acct)
        except Exception:
            continue
    return [a.to_dict() for a in sorted(out, key=lambda a: (a.start_ts, a.run_id))], pending


def held(job: dict[str, Any], now: float) -> dict[int, list[tuple[float, float]]]:
    """The stretches a server job held each GPU: from its start, across its resizes, to its end."""
    start = job.get("started_ts")
    if not isinstance(start, (int, float)):
        return {}
    ended = job.get("ended_ts")
    end = float(ended) if isinstance(ended, (int, float)) else now
    resizes = [h for h in job.get("history") or () if h.get("kind") in RESIZES and "ts" in h]
    gpus = set(resizes[0].get("from") or ()) if resizes else set(job.get("gpus") or ())
    out: dict[int, list[tuple[float, float]]] = {}
    t = float(start)
    for h in resizes:
        for g in gpus:
            out.setdefault(int(g), []).append((t, float(h["ts"])))
        gpus, t = set(h.get("to") or ()), float(h["ts"])
    for g in gpus:
        out.setdefault(int(g), []).append((t, end))
    return out


def overlap(stretches: Iterable[tuple[float, float]], segments: Iterable[Segment], part: str) -> float:
    """Seconds of ``stretches`` that ``segments`` name ``part``."""
    total = 0.0
    segs = [s for s in segments if s.part == part]
    for a, b in stretches:
        total += sum(max(0.0, min(b, s.end) - max(a, s.start)) for s in segs)
    return total


def gpu_hours(snapshot: dict[str, Any], accounts: dict[str, Account], now: float) -> list[dict[str, Any]]:
    """Per GPU of the server: the hours jobs held it and the hours of those that became kept training."""

    def blank(gpu: int, name: str = "") -> dict[str, Any]:
        return {"gpu": gpu, "name": name, "allocated_s": 0.0, "productive_s": 0.0, "jobs": []}

    per = {int(g["index"]): blank(int(g["index"]), g.get("name", "")) for g in snapshot.get("gpus", [])}
    for job in snapshot.get("jobs", []):
        acct = accounts.get(job.get("run_id") or "")
        for gpu, stretches in held(job, now).items():
            row = per.setdefault(gpu, blank(gpu))
            row["allocated_s"] += sum(b - a for a, b in stretches)
            if acct is not None:
                row["productive_s"] += overlap(stretches, acct.segments, "productive")
            row["jobs"].append(job.get("id"))
    return [per[g] for g in sorted(per)]


def payload(index: RunsIndex, server: Any, now: float) -> dict[str, Any]:
    """What ``/api/goodput`` answers: the parts and their names, every run, and the server's GPUs."""
    out: dict[str, Any] = {
        "parts": list(PARTS),
        "lost": list(LOST),
        "labels": dict(LABELS),
    }
    out["runs"], out["pending"] = runs_payload(index)
    if server is not None:
        snapshot = server.snapshot()
        accounts: dict[str, Account] = {}
        for job in snapshot.get("jobs", []):
            entry = index.get(job.get("run_id") or "")
            if entry is not None:
                try:
                    accounts[entry.run_id] = index.accounts.account(entry.dir)
                except Exception:
                    continue
        out["gpus"] = gpu_hours(snapshot, accounts, now)
    return out

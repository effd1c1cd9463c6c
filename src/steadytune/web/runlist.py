"""One page of the runs list: every run searched, filtered and sorted, then one slice of it sent.

A runs page of a thousand rows took 2.4-5.8 s to show in Chromium at load 10-30 (the table was
built in 0.6-1.2 s; laying out and painting a thousand rows took the rest), and its live stream
sent the thousand rows again. The page now asks for one slice (``limit`` rows from ``offset``):
the search, the state filter and the sort still run over every run, here, so a run on page 9 is
found by its name, and the counts (``total``, ``matched``, ``states``, ``pending``) are of all runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from steadytune.web.params import BadParam, query_int

SORT_KEYS = (
    "run_id", "state", "step", "loss", "tokens_per_s", "eta_s", "anomalies", "restarts", "updated_ts",
)  # fmt: skip
PAGE_PARAMS = ("limit", "offset", "q", "state", "sort", "order")
MAX_LIMIT = 1000


@dataclass(frozen=True)
class RunQuery:
    """What one runs page shows: ``text`` found in the run id (any case), of one ``state`` or any,
    sorted by ``sort`` (a row key), ``limit`` rows from ``offset``."""

    text: str = ""
    state: str | None = None
    sort: str = "run_id"
    descending: bool = False
    offset: int = 0
    limit: int = 100


def wants_page(q: Mapping[str, list[str]]) -> bool:
    """Whether a request asks for a page (any of :data:`PAGE_PARAMS`); without one, the whole list."""
    return any(name in q for name in PAGE_PARAMS)


def parse_query(q: Mapping[str, list[str]]) -> RunQuery:
    """The :class:`RunQuery` of a request's query string; :class:`BadParam` names a wrong value."""
    sort = (q.get("sort") or ["run_id"])[0]
    if sort not in SORT_KEYS:
        raise BadParam("sort", f"sort={sort[:40]!r}: sort by one of {', '.join(SORT_KEYS)}")
    order = (q.get("order") or ["asc"])[0]
    if order not in ("asc", "desc"):
        raise BadParam("order", f"order={order[:40]!r}: asc or desc")
    state = (q.get("state") or [""])[0] or None
    return RunQuery(
        text=(q.get("q") or [""])[0].strip()[:200],
        state=state,
        sort=sort,
        descending=order == "desc",
        offset=query_int(q, "offset", 0, lo=0),
        limit=query_int(q, "limit", 100, lo=1, hi=MAX_LIMIT),
    )


TEXT_KEYS = ("run_id", "state")


def _sort_key(sort: str) -> Any:
    kinds: tuple[type, ...] = (str,) if sort in TEXT_KEYS else (int, float)

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        value = row.get(sort)
        # A run with no such value (or one of another type: a hand-edited status.json) is sorted
        # apart below, last in either order; one never compared with the other kind.
        if isinstance(value, bool) or not isinstance(value, kinds):
            return ((), str(row.get("run_id")))
        return (value, str(row.get("run_id")))

    return key


def select(rows: Sequence[dict[str, Any]], query: RunQuery) -> dict[str, Any]:
    """The page of ``rows`` (every run's row) that ``query`` asks for, with the counts of all runs.

    ``total``: every run; ``states``: runs per state; ``pending``: runs not read yet (their row
    is their ``status.json``'s); ``matched``: the runs the search and filter keep, of which
    ``runs`` is the slice from ``offset``. A row without the sorted value (a pending run's loss)
    comes after those with one, in either order.
    """
    states = dict(Counter(str(r.get("state")) for r in rows))
    text = query.text.lower()
    kept = [
        r for r in rows
        if (not text or text in str(r.get("run_id", "")).lower())
        and (query.state is None or r.get("state") == query.state)
    ]  # fmt: skip
    key = _sort_key(query.sort)
    valued = [r for r in kept if key(r)[0] != ()]
    valued.sort(key=key, reverse=query.descending)
    ordered = valued + sorted((r for r in kept if key(r)[0] == ()), key=lambda r: str(r.get("run_id")))
    return {
        "runs": ordered[query.offset : query.offset + query.limit],
        "total": len(rows),
        "matched": len(ordered),
        "offset": query.offset,
        "limit": query.limit,
        "states": states,
        "pending": sum(1 for r in rows if r.get("indexing")),
        "query": {
            "q": query.text,
            "state": query.state,
            "sort": query.sort,
            "order": "desc" if query.descending else "asc",
        },
    }


__all__ = ["MAX_LIMIT", "PAGE_PARAMS", "SORT_KEYS", "RunQuery", "parse_query", "select", "wants_page"]

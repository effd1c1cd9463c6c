"""``run.db``: the SQLite (WAL) index of one run, rebuilt from the JSONL if lost.

The JSONL files are the truth; this is the fast index the dashboard, ``/metrics``
and ``analyze`` query. Every ``add_*`` is an idempotent upsert on a natural key
(rank+step, event seq, sample ts, plan revision), so the same line may be fed
twice (a supervisor and a dashboard tailing the same run) without harm.

Steps: after a restart the worker records the same step again under a later
``attempt``; the latest attempt wins, per rank. Every upsert stamps the row with
a new ``version`` so a live reader can ask for "what changed since version N".

Gradient flow: a step whose ``extra["gradflow"]`` holds per-layer statistics
(every 50 steps, see ``guard/gradflow.py``) also gets a row in ``gradflow``,
stamped with its step's version and replaced with it after a restart.

The parts: :mod:`.schema` (tables, connection), :mod:`.ingest` (writers, sync from the
JSONL), :mod:`.queries` (series, changes, events, plans), :mod:`.gradflow` (per-layer
gradient statistics).

No torch here: the supervisor and the web server import this package.
"""

from __future__ import annotations

from steadytune.rundir import RunDir
from steadytune.telemetry.store.gradflow import GradFlow, GradFlowQueries
from steadytune.telemetry.store.ingest import Ingest
from steadytune.telemetry.store.queries import Queries, Series
from steadytune.telemetry.store.schema import (
    GPU_METRICS,
    ROLLUP,
    SCHEMA_VERSION,
    STEP_METRICS,
    SYSTEM_METRICS,
)

__all__ = [
    "GPU_METRICS",
    "ROLLUP",
    "SCHEMA_VERSION",
    "STEP_METRICS",
    "SYSTEM_METRICS",
    "GradFlow",
    "RunStore",
    "Series",
    "open_store",
]


class RunStore(Ingest, Queries, GradFlowQueries):
    """The SQLite index of one run. Thread-safe; one connection guarded by a lock."""

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(run_dir: RunDir) -> RunStore:
    """The run's ``run.db``, created and filled from the JSONL when it is missing."""
    fresh = not run_dir.db.exists()
    store = RunStore(run_dir.db)
    if fresh:
        store.rebuild(run_dir)
    return store

"""The CPU each test costs, one line per test: ``python -m pytest -p tests.cputime`` (docs/testing.md).

The suite is CPU-bound on 2 cores, so what a test costs the suite is the CPU of its processes, not its
wall time (the other worker and anything else running stretch that). A line holds the test's id, its wall
seconds, the CPU seconds of the pytest process, those of the processes it started and has reaped (a
supervisor counts its worker, its spare and their children once it has reaped them), and the load
average at its end, tab-separated, appended to ``$STEADYTUNE_TEST_CPU`` (default ``test-cpu.tsv``), so
that a run stopped midway keeps what it measured. A process a test leaves running, or a Ray node it
shuts down without waiting for it, is not counted.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Generator

import pytest


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    own0, children0 = _cpu()
    start = time.monotonic()
    yield
    own1, children1 = _cpu()
    line = (
        f"{item.nodeid}\t{time.monotonic() - start:.2f}\t{own1 - own0:.2f}\t{children1 - children0:.2f}"
        f"\t{os.getloadavg()[0]:.1f}\n"
    )
    with open(os.environ.get("STEADYTUNE_TEST_CPU", "test-cpu.tsv"), "a") as out:
        out.write(line)

"""The GPU server's socket: any line a client sends gets an answer, never an exception.

Documented clean answer: ``{"ok": false, "error": ...}``; the daemon is real, on a fake GPU
reading, and starts nothing (its command is ``false`` and it is never ticked here).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from steadytune.server.api import answer_line
from steadytune.server.daemon import Daemon, ServerPaths
from steadytune.server.ledger import GIB, GpuReading
from steadytune.server.queue import JobQueue
from tests.fuzz.conftest import cases
from tests.fuzz.strategies import json_values

OPS = ["ping", "queue", "submit", "cancel", "hold", "release", "job", "resize", "nope"]
KEYS = [
    "op",
    "job",
    "gpus",
    "reason",
    "refused",
    "cmd",
    "kind",
    "need",
    "priority",
    "env",
    "label",
    "config",
    "run_dir",
    "held",
    "cwd",
    "output_dir",
]
requests = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=6).flatmap(
    lambda d: st.sampled_from(OPS).map(lambda op: {**d, "op": op})
)
lines = st.one_of(
    requests.map(lambda r: json.dumps(r, allow_nan=True, default=str).encode()),
    st.binary(max_size=300),
    st.integers(1, 5000).map(lambda n: b"[" * n),
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    root = tmp_path_factory.mktemp("srv")
    paths = ServerPaths(root / "srv", root / "runs")
    paths.runs_dir.mkdir(parents=True)
    readings = (GpuReading(0, 24 * GIB, 2 * GIB, "fake", 0.1, ()),)
    d = Daemon(JobQueue(paths.queue), paths, lambda: readings, command=lambda job, runs: ["false"])
    d.queue.submit({"kind": "supervise", "cmd": ["x"], "label": "j"}, GIB, "user")
    return d


@cases(300)
@given(lines)
def test_any_line_gets_an_answer(daemon: Daemon, line: bytes) -> None:
    answer = answer_line(daemon, line, "fuzz")
    assert isinstance(answer, dict) and isinstance(answer.get("ok"), bool), answer
    json.dumps(answer)  # and it can be sent back
    event("ok" if answer["ok"] else "refused")
    assert answer["ok"] or (isinstance(answer.get("error"), str) and answer["error"])

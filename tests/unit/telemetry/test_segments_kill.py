"""A writer killed (SIGKILL) at any moment of its rotations leaves a stream that reads back whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from steadytune.telemetry import segments
from steadytune.telemetry.jsonl import JsonlReader
from steadytune.telemetry.stream import JsonlWriter

SEGMENT = 256 << 10  # compressing one takes a few ms: a kill often lands while one is under way

WRITER = """
import sys
from pathlib import Path
from steadytune.telemetry.stream import JsonlWriter
w = JsonlWriter(Path(sys.argv[1]), segment_bytes=int(sys.argv[2]))
i = 0
while True:
    w.write_raw({"type": "x", "i": i, "pad": "q" * (i % 40)})
    i += 1
"""


def _killed_writer(live: Path, rotations: int, extra_s: float) -> None:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(live), str(SEGMENT)])
    try:
        deadline = time.monotonic() + 60
        while len(segments.segments(live)) < rotations and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(extra_s)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def _read(live: Path) -> list[int]:
    return [d["i"] for d in JsonlReader(live).dicts()]


def test_a_kill_mid_rotation_leaves_every_line_once(tmp_path: Path) -> None:
    caught_mid_way = 0
    for trial in range(8):
        live = tmp_path / f"t{trial}" / "rank-0.jsonl"
        live.parent.mkdir()
        _killed_writer(live, rotations=2 + trial % 3, extra_s=0.003 * trial)
        names = os.listdir(live.parent)
        # A plain segment or a temp file: the kill came between a seal and the end of its compression.
        caught_mid_way += any(n.endswith(".tmp") or (n.endswith(".jsonl") and n != live.name) for n in names)
        got = _read(live)
        assert got == list(range(len(got))) and len(got) > 2 * SEGMENT // 80, names
        # The stream's next writer finishes what the killed one left; nothing moves.
        with JsonlWriter(live, segment_bytes=SEGMENT) as w:
            w.write_raw({"type": "x", "i": len(got)})
        assert all(s.compressed for s in segments.segments(live))
        assert not any(n.endswith(".tmp") for n in os.listdir(live.parent))
        assert _read(live) == list(range(len(got) + 1))
    assert caught_mid_way >= 1  # the kills did land inside rotations, not only between them

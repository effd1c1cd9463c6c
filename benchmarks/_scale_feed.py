"""A stand-in worker for benchmarks/scale.py: a generated telemetry stream, no model.

    python benchmarks/_scale_feed.py RUN_DIR --ranks 8 --prefill 100000 --rate 10

It writes what steadytune's own worker writes into ``telemetry/rank-N.jsonl`` (a step record
per rank and step, with a batch fingerprint of 8 samples, device memory, and per-layer gradient
flow every 50 steps, as the guard records them), through the same writer. First ``--prefill``
steps as fast as the supervisor takes them (it writes a chunk, then waits until the supervisor's
``status.json`` is within two chunks of it, so the supervisor is never handed a million lines in
one read), then ``--rate`` steps per second until told otherwise. With several ranks the prefill's
writes go round the ranks 4 steps at a time, as a live run's ranks keep in step.

Orders come through the file ``RUN_DIR/feed-orders`` (one word, read before every live step):
``run`` (the default), ``hang`` (every rank falls silent, the process stays), ``straggle`` (the
last rank's compute time turns 3x) and ``stop`` (every rank writes its last words, the process
exits 0). What it did and when goes to ``RUN_DIR/feed-state.json``: the phase, the step, and for
``hang`` and ``straggle`` the wall time and step at which they began.

With ``--save-every N`` rank 0 reports a checkpoint saved at every N-th step, as the guard does
after a save (no checkpoint is written: the supervisor's side of a save is what is measured, its
bookkeeping and, past 20,000 steps, bringing the detectors' saved state up to the save before).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

from steadytune.records import BatchFingerprint, Event, StepRecord, WorkerExit, to_json
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.segments import segment_bytes_from_env
from steadytune.telemetry.stream import JsonlWriter

GIB = 1 << 30
LAYERS = ["embed_tokens", *(f"layers.{i}" for i in range(24)), "norm", "lm_head"]
BINS = [-8.0, -6.0, -4.0, -3.0, -2.0, -1.0, 0.0]
BATCH = 8
GRADFLOW_EVERY = 50  # the guard's default interval


def is_spike(step: int) -> bool:
    """One step in every 100,000 (777, 100,777, ...) has a loss 3x its level: what a chart must keep."""
    return step % 100_000 == 777


def loss_at(step: int, rng: random.Random) -> float:
    """A healthy long run: a slow decay under a little noise, and the rare spike."""
    level = 0.6 + 1.8 / (1.0 + step / 20_000)
    return 3.0 * level if is_spike(step) else level + rng.gauss(0.0, 0.02)


def gradflow(step: int) -> dict:
    """A healthy gradient-flow recording of the 27 layers at ``step``, as the guard writes it."""
    norm = [0.5 * 0.9**i * (1 + 0.1 * math.sin(step / 300 + i)) for i in range(len(LAYERS))]
    return {
        "layers": LAYERS,
        "norm": norm,
        "zero_frac": [0.01] * len(LAYERS),
        "hist": [[1, 4, 30, 60, 20, 3]] * len(LAYERS),
        "bins": BINS,
    }


def record(step: int, rank: int, ts: float, rng: random.Random, compute_s: float) -> StepRecord:
    first = (step * BATCH * 64 + rank * BATCH) % 1_000_000
    ids = tuple(range(first, first + BATCH))
    extra: dict = {"compute_time_s": compute_s}
    if step % GRADFLOW_EVERY == 0:
        extra["gradflow"] = gradflow(step)
    return StepRecord(
        step=step,
        ts=ts,
        rank=rank,
        loss=loss_at(step, rng),
        grad_norm=1.0 + 0.1 * rng.random(),
        lr=2e-5 * min(1.0, step / 1000),
        tokens=BATCH * 1024,
        samples=BATCH,
        step_time_s=0.1,
        epoch=step / 50_000,
        mem_allocated_bytes=int(30.5 * GIB),
        mem_reserved_bytes=int(34 * GIB),
        mem_peak_bytes=int(36 * GIB),
        rss_bytes=int(7 * GIB),
        batch=BatchFingerprint(ids, tuple(f"{(i * 2654435761) & 0xFFFFFFFFFFFFFFF:015x}" for i in ids)),
        extra=extra,
    )


def saved(step: int, attempt: int, ts: float) -> Event:
    """What the guard reports after a save (``guard/hf.py``), from rank 0."""
    return Event(
        ts=ts, kind="lifecycle", name="checkpoint_saved", message=f"saved checkpoint-{step}", step=step,
        data={"rank": 0, "attempt": attempt, "path": f"checkpoint-{step}", "bytes": 0},
    )  # fmt: skip


def status_step(run: RunDir) -> int:
    try:
        return int(json.loads(run.status.read_text()).get("step") or 0)
    except (OSError, ValueError):
        return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument(
        "--prefill", type=int, default=0, help="steps written as fast as the supervisor takes them"
    )
    p.add_argument("--chunk", type=int, default=2000)
    p.add_argument("--rate", type=float, default=10.0, help="steps per second after the prefill")
    p.add_argument("--max-live", type=int, default=10**9, help="live steps at most, then stop")
    p.add_argument("--save-every", type=int, default=0, help="a checkpoint reported every N steps (0: none)")
    args = p.parse_args()
    run = RunDir(args.run_dir)
    attempt = int(os.environ.get("STEADYTUNE_ATTEMPT", "0"))
    writers = [JsonlWriter(run.telemetry(r), segment_bytes_from_env()) for r in range(args.ranks)]
    rngs = [random.Random(1000 + r) for r in range(args.ranks)]
    orders, state_path = run.root / "feed-orders", run.root / "feed-state.json"
    state: dict = {"phase": "prefill", "step": 0}

    def note(**kw: object) -> None:
        state.update(kw)
        atomic_write_text(state_path, json.dumps(state))

    # The ranks of a live run write each step at about the same moment: the prefill's writes go
    # round the ranks a few steps at a time (fewer than straggler_lag_points), so a supervisor that
    # reads between two of them never sees one rank a whole chunk ahead of the next.
    piece = args.chunk if args.ranks == 1 else 4
    step = 0
    while step < args.prefill:
        hi = min(args.prefill, step + args.chunk)
        now = time.time()
        for lo in range(step, hi, piece):
            for r, w in enumerate(writers):
                lines = []
                for s in range(lo + 1, min(hi, lo + piece) + 1):
                    lines.append(to_json(record(s, r, now, rngs[r], 0.09)))
                    if r == 0 and args.save_every and s % args.save_every == 0:
                        lines.append(to_json(saved(s, attempt, now)))
                w._line("\n".join(lines))  # one write per piece and rank
        step = hi
        while status_step(run) < step - 2 * args.chunk:
            time.sleep(0.05)
    note(phase="live", step=step, live_since=time.time())
    interval = 1.0 / args.rate
    next_t = time.monotonic()
    live = 0
    while live < args.max_live:
        try:
            word = orders.read_text().strip()
        except OSError:
            word = "run"
        if word == "stop":
            break
        if word == "hang":
            if state["phase"] != "hang":
                note(phase="hang", hang_ts=time.time(), hang_step=step)
            time.sleep(0.05)
            continue
        if word == "straggle" and state["phase"] != "straggle":
            note(phase="straggle", straggle_ts=time.time(), straggle_step=step + 1)
        step += 1
        live += 1
        now = time.time()
        for r, w in enumerate(writers):
            slow = state["phase"] == "straggle" and r == args.ranks - 1
            w.write(record(step, r, now, rngs[r], 0.27 if slow else 0.09))
        if args.save_every and step % args.save_every == 0:
            writers[0].write(saved(step, attempt, now))
        next_t += interval
        time.sleep(max(0.0, next_t - time.monotonic()))
    for r, w in enumerate(writers):
        w.write(WorkerExit(ts=time.time(), rank=r, attempt=attempt, step=step, status="completed"))
        w.close()
    note(phase="done", step=step)
    return 0


if __name__ == "__main__":
    sys.exit(main())

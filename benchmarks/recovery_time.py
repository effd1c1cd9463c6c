"""How long a recovery takes on the demo job: a rollback in process, the same rollback by a restart, a kill.

    python benchmarks/recovery_time.py [--rounds 2] [--steps 200]

Each round runs three drill faults (``steadytune.drill``: a real supervisor, a real worker
process, real signals) on ``steadytune demo``'s config, and reads the figure the drill's
"recover s" column shows:

- ``spike, in process``: the rollback's action event to the first step of the rolled-back
  attempt (``recover.in_process_rollback: true``, the default); beside it the worker's own
  reload time (its ``rolled_back`` event: the request taken to training again, the
  checkpoint load included) and the wait for the step boundary that takes the request;
- ``spike, restart``: the same rollback by a restart (``in_process_rollback: false``), which the
  standby worker takes;
- ``kill, standby``: SIGKILL to the worker's first step again, through the standby worker (the
  default, ``recover.standby_worker: true``): a spare that has imported everything and waits;
  beside it the way there (the death noticed, the orders sent, the model and checkpoint loaded:
  the attempt's ``train_begin``), and the spare's memory while it waits (RSS, and USS: its own pages);
- ``kill, new process``: the same kill, restarted in a new process (``standby_worker: false``).

``overhead.py`` runs it after its own figures. Goals: a rollback in ≤ 1 s plus the checkpoint
load, a kill in ≤ 5 s. The machine's load average is printed with each round: on shared cores,
the figures move with it.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

VARIANTS = ("spike, in process", "spike, restart", "kill, standby", "kill, new process")
# The stages of a kill's recovery, each from the kill (s).
STAGES = ("noticed", "orders", "train_begin", "first_step")


def demo_base(work: Path, steps: int) -> dict[str, Any]:
    from steadytune.cli.demo import demo_config
    from steadytune.train.assets import ensure_demo_assets

    return demo_config(ensure_demo_assets(), str(work / "runs"), steps, "full")


def one(base: dict[str, Any], work: Path, variant: str, run_id: str) -> dict[str, float | None]:
    from steadytune.drill.faults import catalogue
    from steadytune.drill.runner import deep_merge, report, run_one
    from steadytune.records import Event
    from steadytune.telemetry.events import read_events
    from steadytune.telemetry.stream import iter_records

    kill = variant.startswith("kill")
    spec = catalogue(base["train"]["save_steps"])["kill" if kill else "spike"]
    recover = {
        "in_process_rollback": variant != "spike, restart",
        "standby_worker": variant != "kill, new process",
    }
    result, external = run_one(deep_merge(base, {"recover": recover}), work / "runs", run_id, spec)
    rep = report(spec, result, external)
    events = read_events(result.run.events)
    asked = next((e for e in events if e.name == "rollback_in_process"), None)
    # The worker's own events, stamped by its clock when they happened (events.jsonl stamps them when
    # the supervisor reads them, up to a poll later).
    streamed = [r for r in iter_records(result.run.telemetry(0)) if isinstance(r, Event)]
    done = next((e for e in streamed if e.name == "rolled_back"), None)
    taken = next((e for e in streamed if e.name == "ack_rollback"), None)
    out: dict[str, float | None] = {
        "recover_s": rep.recovery_seconds,
        "reload_s": done.data.get("reload_s") if done else None,
        "boundary_s": (taken.ts - asked.ts) if taken and asked else None,
        "recovered": float(rep.recovered),
        "load": os.getloadavg()[0],
    }
    if kill and external is not None:
        out.update(kill_stages(result.run, events, external))
    return out


def kill_stages(run: Any, events: list[Any], killed: float) -> dict[str, float | None]:
    """Each stage of the restart after the kill at ``killed``, in seconds from it; the spare's size."""
    from steadytune.records import Event, StepRecord
    from steadytune.telemetry.stream import iter_records

    noticed = next((e.ts for e in events if e.name == "restart" and e.ts >= killed), None)
    started = next((e for e in events if e.name == "worker_started" and e.data.get("attempt") == 1), None)
    later = [r for r in iter_records(run.telemetry(0)) if r.ts >= (started.ts if started else killed)]
    begun = next((r.ts for r in later if isinstance(r, Event) and r.name == "train_begin"), None)
    first = next((r.ts for r in later if isinstance(r, StepRecord) and r.attempt == 1), None)
    at = {
        "noticed": noticed,
        "orders": started.ts if started else None,
        "train_begin": begun,
        "first_step": first,
    }
    out: dict[str, float | None] = {k: (v - killed if v is not None else None) for k, v in at.items()}
    out["standby"] = float(bool(started and started.data.get("standby")))
    ready = (run.logs / "standby-0.log").read_text() if (run.logs / "standby-0.log").exists() else ""
    got = re.search(r"ready in ([\d.]+)s, RSS (\d+) MiB, USS (\d+) MiB", ready)
    if got:
        out.update(spare_ready_s=float(got[1]), rss_mib=float(got[2]), uss_mib=float(got[3]))
    return out


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} [{min(values):.2f}–{max(values):.2f}]"


def measure(rounds: int, steps: int, work: Path | None = None) -> dict[str, list[dict[str, float | None]]]:
    """Every variant ``rounds`` times, interleaved; prints each run and the summary."""
    tmp = None if work else tempfile.TemporaryDirectory(prefix="st-recovery-")
    root = work or Path(tmp.name)  # type: ignore[union-attr]
    base = demo_base(root, steps)
    results: dict[str, list[dict[str, float | None]]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        k = r % len(VARIANTS)
        for n, variant in enumerate(VARIANTS[k:] + VARIANTS[:k]):
            got = one(base, root, variant, f"r{r}-{n}")
            results[variant].append(got)
            print(
                f"  round {r + 1} {variant:<18} recover {got['recover_s']} s  (load {got['load']:.1f})",
                flush=True,
            )
    print()
    print(f"recovery on the demo job ({rounds} rounds, s, median [min–max]):")
    for variant in VARIANTS:
        rows = results[variant]
        line = f"  {variant:<18} {spread([x['recover_s'] for x in rows if x['recover_s'] is not None])}"
        if variant == "spike, in process":
            reload = [x["reload_s"] for x in rows if x["reload_s"] is not None]
            wait = [x["boundary_s"] for x in rows if x["boundary_s"] is not None]
            line += f"   (reload {spread(reload)}, wait for the step boundary {spread(wait)})"
        if variant.startswith("kill"):
            line += (
                "   (from the kill: "
                + ", ".join(
                    f"{stage} {spread([x[stage] for x in rows if x.get(stage) is not None])}"
                    for stage in STAGES
                )
                + ")"
            )
            if variant == "kill, standby" and not all(x.get("standby") for x in rows):
                line += "   NOT THROUGH THE STANDBY in every round"
        if not all(x["recovered"] for x in rows):
            line += "   NOT RECOVERED in every round"
        print(line)
    inproc = [x["recover_s"] for x in results["spike, in process"] if x["recover_s"] is not None]
    restart = [x["recover_s"] for x in results["spike, restart"] if x["recover_s"] is not None]
    if inproc and restart:
        ratio = statistics.median(inproc) / statistics.median(restart)
        print(f"  rollback in process / by restart: {ratio:.2f}")
    rss = [x["rss_mib"] for x in results["kill, standby"] if x.get("rss_mib") is not None]
    uss = [x["uss_mib"] for x in results["kill, standby"] if x.get("uss_mib") is not None]
    ready = [x["spare_ready_s"] for x in results["kill, standby"] if x.get("spare_ready_s") is not None]
    if rss:
        print(
            f"  the waiting spare: RSS {spread(rss)} MiB, USS {spread(uss)} MiB, "
            f"ready {spread(ready)} s after its start"
        )
    loads = [x["load"] for rows in results.values() for x in rows if x["load"] is not None]
    print(f"  machine load (1 min) over the rounds: {spread(loads)} on {os.cpu_count()} CPUs")
    print("  goals: rollback ≤ 1 s + the checkpoint load; kill ≤ 5 s")
    if tmp is not None:
        tmp.cleanup()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps per job (faults at 3/4 of them)")
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
    measure(args.rounds, args.steps, args.work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

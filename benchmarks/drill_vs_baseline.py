"""The recovery drill, side by side: steadytune against a plain HF Trainer under torchrun.

    python benchmarks/drill_vs_baseline.py [--faults nan,oom,...] [--steps 80] [--save-steps N]
                                           [--work-dir DIR] [--keep] [--json FILE]

For the clean reference and for each fault of the drill's catalogue (steadytune.drill.faults:
nan, oom, spike, kill, kill-during-save, hang, corrupt-checkpoint, placed relative to the
checkpoint interval), both sides train the same demo model on the same data with the same
hyper-parameters (lr 2e-3, batch 8, cosine, warmup steps/10, save every steps/4):

- steadytune: ``steadytune.drill.runner.run_one`` + ``report``, exactly as ``steadytune drill``;
- baseline: benchmarks/_baseline_trainer.py (a plain Trainer, newest ``checkpoint-*`` resumed
  on start, ``save_total_limit=2``, ``auto_find_batch_size=True``, NaN/Inf logging filter on),
  launched with ``torch.distributed.run --standalone --nproc_per_node=1 --max-restarts=3``; the
  same faults are injected from inside its script, and the external ones (SIGKILL, a flipped
  byte) by this benchmark, on the first attempt only.

Every run is a child process in its own session with a wall-clock limit (3x the side's clean
run, at least 60 s); a run that hangs or crashes is killed with its whole process tree and
reported, never fatal to the benchmark. The final weights of both sides are then read and
evaluated here, in the same way: finiteness of every floating tensor (safetensors), and the
token-weighted mean cross-entropy on the demo eval set.

Both sides run with OMP_NUM_THREADS=1: on a small shared CPU box, torch's default thread
pool makes this tiny model 10x slower, for both sides alike.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _drill_table import LEGEND, Outcome, lost_line, render

HERE = Path(__file__).resolve().parent
BASELINE_SCRIPT = HERE / "_baseline_trainer.py"
ALL_FAULTS = ("nan", "oom", "spike", "kill", "kill-during-save", "hang", "corrupt-checkpoint")
CLEAN_LIMIT_S = 600.0  # the clean runs set the limit of the others; they get a fixed generous one
MIN_LIMIT_S = 90.0  # room for torchrun's 4 starts (~15 s each here) to play out before the limit


# --------------------------------------------------------------------------- processes


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a child started with start_new_session=True, its group, and every descendant.

    torchrun and steadytune's supervisor both put their workers in sessions of their own,
    so killing our child's process group alone would leave the workers running.
    """
    try:
        import psutil

        kids = psutil.Process(proc.pid).children(recursive=True)
    except Exception:
        kids = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for kid in kids:
        try:
            kid.kill()
        except Exception:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("STEADYTUNE_FAULTS", None)
    env.update(extra)
    return env


def last_error(log: Path, work_dir: Path) -> str:
    """The last exception line a child printed (a worker's own, not torchrun's wrapper), shortened."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    pat = re.compile(r"^(\w+\.)*\w*(Error|Exception|Interrupt)\b:?")
    hits = [
        ln
        for ln in (re.sub(r"^\[rank\d+\]:\s*", "", raw).strip() for raw in lines)
        if pat.match(ln) and "ChildFailedError" not in ln
    ]
    return hits[-1].replace(f"{work_dir}/", "")[:120] if hits else ""


# --------------------------------------------------------------------------- evaluation


class Evaluator:
    """Reads final weights and scores them on the eval set: one procedure for both sides."""

    def __init__(self, assets: Path, max_seq_length: int = 128) -> None:
        import torch
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        from steadytune.train.data import SAMPLE_HASH, SAMPLE_ID, DataSpec, build_dataset
        from steadytune.train.runner import Collator

        torch.set_num_threads(1)
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()

        tok = AutoTokenizer.from_pretrained(str(assets / "model"))
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        ds = build_dataset(
            tok, DataSpec(str(assets / "eval.jsonl"), "instruction", max_seq_length=max_seq_length)
        )
        ds = ds.remove_columns([c for c in (SAMPLE_ID, SAMPLE_HASH) if c in ds.column_names])
        collate = Collator(tok.pad_token_id)
        rows = [ds[i] for i in range(len(ds))]
        self.batches = [collate(rows[i : i + 8]) for i in range(0, len(rows), 8)]

    def __call__(self, final_dir: Path) -> tuple[bool | None, float | None]:
        import torch
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM

        files = sorted(final_dir.glob("*.safetensors")) if final_dir.is_dir() else []
        if not files:
            return None, None
        try:
            finite = all(
                bool(t.isfinite().all())
                for f in files
                for t in load_file(str(f)).values()
                if t.is_floating_point()
            )
            model = AutoModelForCausalLM.from_pretrained(str(final_dir), dtype=torch.float32)
        except Exception:
            return False, None  # unreadable weights: neither finite nor usable
        model.eval()
        total, tokens = 0.0, 0
        with torch.no_grad():
            for b in self.batches:
                n = int((b["labels"][:, 1:] != -100).sum())
                out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"])
                total += float(out.loss) * n
                tokens += n
        return finite, (total / tokens if tokens else None)


# --------------------------------------------------------------------------- steadytune side


def steadytune_child(args: argparse.Namespace) -> int:
    """In a child process: one drill run (clean or with a fault), its report to --out as JSON."""
    from steadytune.cli.drill import base_config
    from steadytune.drill.faults import catalogue
    from steadytune.drill.runner import as_dict, report, run_one
    from steadytune.goodput.load import run_account

    base = base_config(argparse.Namespace(config=None, steps=args.steps, save_steps=args.save_steps))
    spec = None if args.st_one == "clean" else catalogue(args.save_steps)[args.st_one]
    runs_dir = args.work_dir / "steadytune"
    # Its goodput starts where the baseline's does: when the benchmark launched the process.
    launch = {"launched_ts": float(args.launched)}
    result, ext_ts = run_one(base, runs_dir, args.st_one, spec, launch)
    out: dict[str, Any] = {
        "state": result.state,
        "run_dir": str(result.run.root),
        "goodput": run_account(result.run).to_dict(),
    }
    if spec is not None:
        out["report"] = as_dict(report(spec, result, ext_ts))
    Path(args.out).write_text(json.dumps(out))
    return 0


def max_step(run_dir: Path) -> int:
    from steadytune.records import StepRecord
    from steadytune.telemetry.stream import iter_records

    path = run_dir / "telemetry" / "rank-0.jsonl"
    if not path.exists():
        return 0
    return max((r.step for r in iter_records(path) if isinstance(r, StepRecord)), default=0)


def run_steadytune(kind: str, a: argparse.Namespace, limit: float, evaluate: Evaluator) -> Outcome:
    out_json = a.work_dir / f"steadytune-{kind}.json"
    log = a.work_dir / f"steadytune-{kind}.log"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--st-one",
        kind,
        "--steps",
        str(a.steps),
        "--save-steps",
        str(a.save_steps),
        "--work-dir",
        str(a.work_dir),
        "--out",
        str(out_json),
    ]
    t0 = time.time()
    cmd += ["--launched", repr(t0)]  # its goodput counts from here, as the baseline's does
    with open(log, "w") as lf:
        proc = subprocess.Popen(
            cmd,
            stdout=lf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=child_env(),
            cwd=str(HERE.parent),
        )
        try:
            rc = proc.wait(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            rc, timed_out = None, True
        except BaseException:
            kill_tree(proc)
            raise
    seconds = time.time() - t0
    run_dir = a.work_dir / "steadytune" / kind
    data = json.loads(out_json.read_text()) if out_json.exists() else {}
    rep = data.get("report") or {}
    finite, loss = evaluate(run_dir / "final")
    state = data.get("state")
    why = (
        ""
        if state == "completed"
        else (
            f"timed out after {limit:.0f}s"
            if timed_out
            else f"state {state}"
            if state
            else f"exit {rc}: {last_error(log, a.work_dir)}"
        )
    )
    note = ""
    if rep:
        detected = f"detected at step {rep['detected_at_step']}" if rep["detected"] else "NOT detected"
        secs = rep.get("recovery_seconds")
        rec = f", back in {secs}s" if secs is not None and secs > 0 else ""
        note = f"{detected}; action {rep['action'] or '-'}; restarts {rep['restarts']}{rec}"
    return Outcome(
        state == "completed",
        why,
        finite,
        loss,
        rep.get("steps_redone", 0 if not rep else None),
        max_step(run_dir),
        seconds,
        note,
        data.get("goodput"),
    )


# --------------------------------------------------------------------------- baseline side


class BaselineActor:
    """Follows the baseline's log and does the external faults to its first attempt."""

    def __init__(self, spec: Any, out_dir: Path) -> None:
        self.spec, self.out = spec, out_dir
        self.done = spec is None or spec.actor is None
        self.what = ""
        self.killed_at: float | None = None

    def _kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
            self.killed_at = time.time()
        except ProcessLookupError:
            pass
        self.done = True

    def poll(self, step0: int, pid0: int | None, attempts: int) -> None:
        if self.done or pid0 is None:
            return
        if attempts > 1:  # the first attempt ended before the fault could be done
            self.done = True
            return
        kind, at = self.spec.actor, self.spec.at_step
        target = self.out / f"checkpoint-{at}"
        if kind == "kill" and step0 >= at:
            self.what = f"SIGKILL at step {step0}"
            self._kill(pid0)
        elif (
            kind == "kill_during_save"
            and (target / "model.safetensors").exists()
            and not (target / "trainer_state.json").exists()
        ):
            time.sleep(1.0)  # inside the slow window: weights written, trainer_state.json not yet
            if not (target / "trainer_state.json").exists():
                self.what = f"SIGKILL while saving {target.name} (no trainer_state.json yet)"
                self._kill(pid0)
        elif kind == "corrupt_then_kill" and step0 > at + 2 and (target / "trainer_state.json").exists():
            hit = flip_byte(target / "model.safetensors")
            self.what = f"byte flipped in {target.name}/model.safetensors ({hit}), SIGKILL at step {step0}"
            self._kill(pid0)


def last_logged(log: Path) -> str:
    """The Trainer's last logged loss and grad norm, as a user watching the log would see them."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    hits = re.findall(r"'loss': '([^']*)', 'grad_norm': '([^']*)'", text)
    return f"loss {hits[-1][0]}, grad_norm {hits[-1][1]}" if hits else ""


def flip_byte(path: Path) -> str:
    """Flip (xor 0xFF) the byte in the middle of a safetensors file; say which weight it hit and how."""
    size = path.stat().st_size
    pos = size // 2
    with open(path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0xFF]))
        try:
            f.seek(0)
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            rel = pos - 8 - n
            for name, info in header.items():
                start, end = info.get("data_offsets", (0, 0)) if isinstance(info, dict) else (0, 0)
                if name != "__metadata__" and start <= rel < end and info.get("dtype") == "F32":
                    elem = 8 + n + start + (rel - start) // 4 * 4
                    f.seek(elem)
                    new = bytearray(f.read(4))
                    old = bytearray(new)
                    old[pos - elem] ^= 0xFF
                    was, now = struct.unpack("<f", bytes(old))[0], struct.unpack("<f", bytes(new))[0]
                    return f"{name}[{(rel - start) // 4}] {was:.7g} -> {now:.7g}"
        except (ValueError, struct.error, OSError):
            pass
    return f"byte {pos}"


def read_events(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    try:
        with open(path, encoding="utf-8") as f:
            f.seek(offset)
            chunk = f.read()
    except OSError:
        return [], offset
    end = chunk.rfind("\n") + 1  # only whole lines
    events = [json.loads(line) for line in chunk[:end].splitlines() if line.strip()]
    return events, offset + len(chunk[:end].encode())


def redone_from(events: list[dict[str, Any]]) -> int:
    """Steps trained again: at each (re)start of training, how far the last one got past the resume point."""
    redone, reached, started = 0, 0, False
    for ev in events:
        if ev["ev"] == "step":
            reached = max(reached, ev["step"])
        elif ev["ev"] == "begin":
            if started:
                redone += max(0, reached - ev["step"])
            started, reached = True, ev["step"]
    return redone


def run_baseline(kind: str, a: argparse.Namespace, limit: float, evaluate: Evaluator) -> Outcome:
    from _baseline_goodput import history as baseline_history

    from steadytune.drill.faults import catalogue
    from steadytune.goodput.account import account

    spec = None if kind == "clean" else catalogue(a.save_steps)[kind]
    out_dir = a.work_dir / "baseline" / kind
    out_dir.mkdir(parents=True, exist_ok=True)
    events_path = a.work_dir / "baseline" / f"{kind}.events.jsonl"
    log = a.work_dir / "baseline" / f"{kind}.log"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=1",
        "--max-restarts=3",
        str(BASELINE_SCRIPT),
        "--model",
        str(a.assets / "model"),
        "--train",
        str(a.assets / "train.jsonl"),
        "--output_dir",
        str(out_dir),
        "--bench_log",
        str(events_path),
        "--max_steps",
        str(a.steps),
        "--save_steps",
        str(a.save_steps),
        "--warmup_steps",
        str(max(1, a.steps // 10)),
    ]
    env = child_env(BASELINE_FAULTS=json.dumps(spec.env) if spec else "")
    actor = BaselineActor(spec, out_dir)
    events: list[dict[str, Any]] = []
    offset, step0, pid0 = 0, 0, None
    t0 = time.time()
    timed_out = False
    with open(log, "w") as lf:
        proc = subprocess.Popen(
            cmd,
            stdout=lf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=str(HERE.parent),
        )
        try:
            while proc.poll() is None:
                if time.time() - t0 > limit:
                    kill_tree(proc)
                    timed_out = True
                    break
                new, offset = read_events(events_path, offset)
                events += new
                for ev in new:
                    if ev["attempt"] == 0:
                        pid0 = ev["pid"]
                        if ev["ev"] == "step":
                            step0 = max(step0, ev["step"])
                starts = len({ev["attempt"] for ev in events})
                actor.poll(step0, pid0, starts)
                time.sleep(0.01)
        except BaseException:
            kill_tree(proc)
            raise
    seconds = time.time() - t0
    events += read_events(events_path, offset)[0]
    rc = proc.returncode
    done = [ev for ev in events if ev["ev"] == "done"]
    survived = not timed_out and rc == 0 and bool(done) and done[-1]["step"] >= a.steps
    attempts = len({ev["attempt"] for ev in events})
    reached = max((ev["step"] for ev in events if ev["ev"] == "step"), default=0)
    err = last_error(log, a.work_dir)
    if timed_out and err and attempts > 1:
        why = f"crash loop ({attempts} starts so far, each: {err}); killed at the {limit:.0f}s limit"
    elif timed_out:
        why = f"no progress after step {reached}; killed at the {limit:.0f}s limit"
    elif not survived:
        why = f"torchrun gave up after {attempts} starts: {err}"
    else:
        why = ""
    finite, loss = evaluate(out_dir / "final")
    notes = [actor.what] if actor.what else []
    if attempts > 1:
        notes.append(f"torchrun starts {attempts}")
    resumes = [ev["resume"] for ev in events if ev["ev"] == "start" and ev.get("resume")]
    if resumes:
        notes.append("resumed from " + ", ".join(Path(r).name for r in resumes))
    batches = [ev["batch"] for ev in events if ev["ev"] == "begin"]
    if len(set(batches)) > 1:
        notes.append(
            "auto_find_batch_size: batch "
            + "->".join(str(b) for b in batches)
            + ", each retry from step 0 with the weights it had"
        )
    trained = sum(1 for ev in events if ev["ev"] == "step")
    if trained != a.steps:
        notes.append(f"{trained} optimizer steps trained in all")
    if spec is not None:
        logged = last_logged(log)
        if logged:
            notes.append(f"last logged {logged}")
    acct = account(baseline_history(events, t0, t0 + seconds, survived, actor.killed_at, timed_out))
    return Outcome(
        survived, why, finite, loss, redone_from(events), reached, seconds, "; ".join(notes), acct.to_dict()
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--faults", default=",".join(ALL_FAULTS), help=f"comma-separated, from {', '.join(ALL_FAULTS)}"
    )
    p.add_argument("--steps", type=int, default=80, help="max_steps of every run (default 80)")
    p.add_argument("--save-steps", type=int, default=None, help="checkpoint interval (default steps/4)")
    p.add_argument("--side", choices=("both", "steadytune", "baseline"), default="both")
    p.add_argument("--work-dir", type=Path, default=None, help="where the runs go (default: a temp folder)")
    p.add_argument(
        "--keep", action="store_true", help="keep the work folder (kept anyway if --work-dir is given)"
    )
    p.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    p.add_argument("--st-one", default=None, help=argparse.SUPPRESS)  # internal: one steadytune run
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--launched", default=None, help=argparse.SUPPRESS)  # when the benchmark started it
    a = p.parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    a.save_steps = a.save_steps or max(1, a.steps // 4)
    if a.st_one:
        return steadytune_child(a)

    faults = [f.strip() for f in a.faults.split(",") if f.strip()]
    unknown = [f for f in faults if f not in ALL_FAULTS]
    if unknown:
        p.error(f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(ALL_FAULTS)}")
    from steadytune.drill.faults import catalogue
    from steadytune.train.assets import ensure_demo_assets

    specs = catalogue(a.save_steps)
    late = [f for f in faults if specs[f].at_step > a.steps]
    if late:
        p.error(
            f"fault(s) {', '.join(late)} fall after --steps {a.steps}; raise --steps or lower --save-steps"
        )
    a.assets = ensure_demo_assets()
    keep = a.keep or a.work_dir is not None
    a.work_dir = (a.work_dir or Path(tempfile.mkdtemp(prefix="drill-vs-baseline-"))).resolve()
    a.work_dir.mkdir(parents=True, exist_ok=True)
    evaluate = Evaluator(a.assets)
    sides = {"steadytune": run_steadytune, "baseline": run_baseline}
    if a.side != "both":
        sides = {a.side: sides[a.side]}
    print(f"runs in {a.work_dir}; {a.steps} steps, checkpoint every {a.save_steps}", flush=True)
    t_start = time.time()
    results: dict[str, dict[str, Outcome]] = {"steadytune": {}, "baseline": {}}
    limits: dict[str, float] = {}
    try:
        for kind in ["clean", *faults]:
            for side, fn in sides.items():
                limit = CLEAN_LIMIT_S if kind == "clean" else limits[side]
                at = "" if kind == "clean" else f" (step {specs[kind].at_step})"
                print(f"  {side:<10} {kind}{at} ...", end="", flush=True)
                try:
                    o = fn(kind, a, limit, evaluate)
                except Exception as exc:  # a broken run must not end the benchmark
                    o = Outcome(
                        False, f"benchmark error: {type(exc).__name__}: {exc}"[:110], None, None, None, 0, 0.0
                    )
                results[side][kind] = o
                if kind == "clean":
                    limits[side] = max(MIN_LIMIT_S, 3 * o.seconds)
                print(f" {'survived' if o.survived else 'FAILED'} in {o.seconds:.0f}s", flush=True)
    finally:
        if not keep:
            shutil.rmtree(a.work_dir, ignore_errors=True)
    total = time.time() - t_start

    rows = []
    for kind in ["clean", *faults]:
        label = kind if kind == "clean" else f"{kind}@{specs[kind].at_step}"
        rows.append((label, results["steadytune"].get(kind), results["baseline"].get(kind)))
    print()
    print(render(rows, a.steps))
    print()
    print(LEGEND.format(steps=a.steps))
    print()
    print("what happened:")
    for kind in ["clean", *faults]:
        for side in ("steadytune", "baseline"):
            o = results[side].get(kind)
            if o is None:
                continue
            text = "; ".join(t for t in (o.note, o.why) if t)
            if text:
                print(f"  {kind:<19}{side:<11}{text}")
    print("\ngoodput (docs/goodput.md): the share of wall time kept as training, and where the rest went")
    for kind in ["clean", *faults]:
        for side in ("steadytune", "baseline"):
            o = results[side].get(kind)
            if o is not None and o.goodput:
                print(f"  {kind:<19}{side:<11}{lost_line(o.goodput)}")
    print(f"\ntotal {total:.0f}s" + ("" if not keep else f"; runs kept in {a.work_dir}"))
    if a.json:
        a.json.write_text(
            json.dumps({side: {k: asdict(o) for k, o in r.items()} for side, r in results.items()}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

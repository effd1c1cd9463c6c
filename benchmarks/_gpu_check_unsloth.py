"""Check 7 of benchmarks/gpu_check.py: an unsloth LoRA run under ``steadytune supervise --inject``.

unsloth trains only on an accelerator (its import raises without one), so nothing here can run it
on the machines the tests run on. On a GPU the step trains a LoRA adapter with unsloth's
``FastLanguageModel`` and TRL's ``SFTTrainer`` (which unsloth patches) through a script a user
would write, under ``supervise --preset hf --inject``; kills the trainer after its first
checkpoint; and checks that the guard was injected into unsloth's trainer, that every step was
recorded, that the restart resumed the checkpoint and that the run completed with finite weights.

A dry run runs the same script with ``--plain`` (transformers and peft in place of unsloth, on the
CPU) through the same supervise line, kill and resume, so the plumbing is exercised where no GPU
is; every unsloth assertion is then skipped with its reason. unsloth and the versions it pins
(transformers <= 5.17, trl <= 1.15) come from the wheels ``WITH_UNSLOTH=1 benchmarks/gpu_wheels.sh``
puts in ``gpu-wheels/unsloth/``, installed into a folder of their own that only this step uses.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _gpu_check_steps import Check, Ctx, say, tail

UNSLOTH_SITE = "STEADYTUNE_GPU_CHECK_UNSLOTH_SITE"  # set by gpu_check.py when it installed the wheels
NO_UNSLOTH = "dry run on CPU: unsloth needs a CUDA device"
STEPS, SAVE = 30, 10

SCRIPT = '''"""A LoRA fine-tune with unsloth, as its users write one (--plain: transformers, peft)."""
import argparse
import json

p = argparse.ArgumentParser()
for flag, kind in (("--model", str), ("--data", str), ("--output_dir", str), ("--max_steps", int),
                   ("--save_steps", int), ("--learning_rate", float), ("--resume_from_checkpoint", str)):
    p.add_argument(flag, type=kind)
p.add_argument("--plain", action="store_true")
a = p.parse_args()
if not a.plain:
    from unsloth import FastLanguageModel  # first: unsloth patches transformers and TRL as it imports

from datasets import Dataset
from trl import SFTConfig, SFTTrainer

with open(a.data) as f:
    rows = [json.loads(line) for line in f][:400]
data = Dataset.from_list([{"text": f"{r['instruction']}\\n{r['input']}\\n{r['output']}"} for r in rows])
targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
if a.plain:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(a.model),
                           LoraConfig(r=8, lora_alpha=16, target_modules=targets, task_type="CAUSAL_LM"))
else:
    model, tok = FastLanguageModel.from_pretrained(a.model, max_seq_length=128, load_in_4bit=False)
    model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, target_modules=targets,
                                             use_gradient_checkpointing="unsloth")
args = SFTConfig(output_dir=a.output_dir, max_steps=a.max_steps, save_steps=a.save_steps, logging_steps=1,
                 per_device_train_batch_size=4, learning_rate=a.learning_rate, report_to="none",
                 dataset_text_field="text", max_length=128, use_cpu=a.plain)
SFTTrainer(model=model, processing_class=tok, train_dataset=data, args=args).train(
    resume_from_checkpoint=a.resume_from_checkpoint)
'''


def _env(ctx: Ctx) -> dict[str, str]:
    env = ctx.env()
    site = os.environ.get(UNSLOTH_SITE)
    if site:  # unsloth's own pins go first, for this step only
        env["PYTHONPATH"] = os.pathsep.join([site, env.get("PYTHONPATH", "")])
    return env


def _import_unsloth(env: dict[str, str]) -> tuple[str | None, str]:
    """(unsloth's version, "") or (None, the last line of the error its import raised)."""
    probe = "import unsloth, importlib.metadata as m; print(m.version('unsloth'))"
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300
        )
    except subprocess.TimeoutExpired:
        return None, "import unsloth took over 300 s"
    if done.returncode == 0:
        return done.stdout.strip().splitlines()[-1], ""
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    return None, lines[-1] if lines else f"exit {done.returncode}"


def _records(run: Path) -> list[Any]:
    from steadytune.rundir import RunDir
    from steadytune.telemetry.stream import iter_records

    return list(iter_records(RunDir(run).telemetry(0)))


def _wait(what: str, predicate: Any, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if predicate():
            return True
        time.sleep(0.2)
    say(f"gave up waiting for {what}")
    return False


def step_unsloth(ctx: Ctx, check: Check) -> None:
    import psutil

    from steadytune.records import Event, StepRecord

    a = ctx.assets()
    work = ctx.work / "unsloth"
    work.mkdir(parents=True, exist_ok=True)
    script = work / "unsloth_lora.py"
    script.write_text(SCRIPT)
    env = _env(ctx)
    version, why = _import_unsloth(env)
    check.figures.update(unsloth=version, unsloth_import_error=why or None)
    check.cuda(ctx, "unsloth imports", lambda: (version is not None, version or why), NO_UNSLOTH)
    if not ctx.dry and version is None:
        check.notes.append("unsloth did not import: carry WITH_UNSLOTH=1 benchmarks/gpu_wheels.sh's wheels")
        return
    out, runs = work / "out", work / "runs"
    model = a["big_model"] if not ctx.dry else a["demo_model"]
    job = [sys.executable, str(script), "--model", model, "--data", a["train"], "--output_dir", str(out),
           "--max_steps", str(STEPS), "--save_steps", str(SAVE), "--learning_rate", "2e-4",
           *(["--plain"] if ctx.dry else [])]  # fmt: skip
    cmd = [sys.executable, "-m", "steadytune.cli.main", "supervise", "--preset", "hf", "--inject",
           "--output-dir", str(out), "--runs-dir", str(runs), "--run-id", "unsloth", "--hang-floor", "60",
           "--quiet", "--", *job]  # fmt: skip
    log = ctx.work / "logs" / "unsloth-supervise.log"
    say("steadytune supervise --inject -- python unsloth_lora.py" + (" --plain" if ctx.dry else ""))
    timeout = max(30.0, min(240.0, ctx.left() - 20))
    with open(log, "ab") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    t0 = time.time()
    try:
        first = out / f"checkpoint-{SAVE}" / "trainer_state.json"
        saved = _wait(f"checkpoint-{SAVE}", first.exists, proc, timeout)
        status = json.loads((runs / "unsloth" / "status.json").read_text()) if saved else {}
        trainer = status.get("worker_pid")
        killed = bool(saved and trainer and psutil.pid_exists(trainer))
        if killed:
            os.kill(trainer, signal.SIGKILL)  # `python script.py` trains in the command's own process
        check.expect(
            f"the trainer was killed after checkpoint-{SAVE}", killed, "" if killed else tail(log, 1500)
        )
        rc = proc.wait(max(10.0, timeout - (time.time() - t0)))
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    check.figures["seconds"] = round(time.time() - t0, 1)
    root = runs / "unsloth"
    events = [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()] if (
        root / "events.jsonl"
    ).exists() else []  # fmt: skip
    names = [e["name"] for e in events]
    done = rc == 0 and "run_completed" in names
    why = f"exit {rc}; last events {names[-4:]}" + ("" if done else "\n" + tail(log, 2000))
    check.expect("supervise exited 0 and the run completed", done, why)
    restarts = [e for e in events if e["name"] == "restart" and "classification" in e.get("data", {})]
    check.expect(f"one restart, resuming checkpoint-{SAVE}",
                 len(restarts) == 1 and f"resuming from checkpoint-{SAVE}" in restarts[0]["message"],
                 "; ".join(e["message"] for e in restarts))  # fmt: skip
    recs = _records(root) if root.exists() else []
    steps = [r for r in recs if isinstance(r, StepRecord) and r.loss is not None and not r.extra.get("eval")]
    injected = [r.message for r in recs if isinstance(r, Event) and r.name == "guard_injected"]
    check.figures.update(trainer=injected[0] if injected else None, steps_recorded=len(steps))
    check.expect(
        "the guard was injected into each attempt's trainer", len(injected) == 2, "; ".join(injected)
    )
    second = [r.step for r in steps if r.attempt == 1]
    check.expect(
        "every step recorded with a finite grad norm, the second attempt from the checkpoint on",
        bool(second)
        and second[0] == SAVE + 1
        and second[-1] == STEPS
        and all(r.grad_norm is not None and math.isfinite(r.grad_norm) for r in steps),
        f"attempt 1 steps {second[:3]}...{second[-1:]}",
    )
    check.cuda(
        ctx, "the trainer the guard sits in is unsloth's",
        lambda: (bool(injected) and "unsloth" in injected[0].lower(), injected[0] if injected else "none"),
        NO_UNSLOTH,
    )  # fmt: skip
    check.cuda(
        ctx, "step records carry CUDA memory",
        lambda: (bool(steps) and all(r.mem_allocated_bytes for r in steps), f"{len(steps)} steps"),
    )  # fmt: skip
    weights = out / f"checkpoint-{STEPS}" / "adapter_model.safetensors"
    finite = weights.exists() and _finite(weights)
    check.expect("the final adapter's weights are finite", finite, str(weights))


def _finite(path: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    return all(bool(torch.isfinite(t).all()) for t in load_file(str(path)).values())

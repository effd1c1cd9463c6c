"""Trouble that comes back at the same step after a rollback is rolled back again, further back.

The job is a real process under `steadytune supervise --preset trl`: a small script that logs as
`trl grpo` does (loss, grad norm, LR, reward, KL) and writes `checkpoint-N` folders as the HF Trainer
does. On its first start, the update of step 8 throws the policy off (as an LR burst does), so the KL
logged from step 9 on is 0.05 where it was 1e-7. The KL detector's level window is not yet full at
step 9, so `kl_blowup` is raised at step 10, and the rollback goes to checkpoint-8: the weights that
update made. Resumed there, the same KL is logged at step 10 again. Before, that second `kl_blowup`
was only printed ("Try: roll back ...") because the policy had acted on a `kl_blowup` starting at step
10 once already, and the run completed with the damage in it; the came-back rule that goes one
checkpoint further back was never reached.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from steadytune.records import StepRecord
from steadytune.telemetry.events import read_events
from steadytune.telemetry.stream import iter_records

from .hfjob import supervise_cmd

pytestmark = pytest.mark.slow

# The job: every value its state decides, so what a checkpoint holds is what a resume logs.
JOB = r"""
import argparse, json, os, time
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--output_dir", required=True)
p.add_argument("--resume_from_checkpoint")
p.add_argument("--learning_rate", type=float, default=1e-6)
a, _ = p.parse_known_args()
out = Path(a.output_dir)
bad, start = False, 0
if a.resume_from_checkpoint:
    ck = Path(a.resume_from_checkpoint)
    bad = json.loads((ck / "policy.json").read_text())["bad"]
    start = json.loads((ck / "trainer_state.json").read_text())["global_step"]
for step in range(start + 1, 25):
    kl = 0.0 if step == 1 else (0.05 if bad else 1e-7 * step)
    log = {"loss": 0.0, "grad_norm": 1.0 + 0.01 * (step % 3), "learning_rate": a.learning_rate,
           "reward": 0.8 + 0.02 * (step % 4), "reward_std": 0.1, "kl": kl, "epoch": step / 100}
    print(json.dumps(log).replace('"', "'"), flush=True)
    if step == 8 and not a.resume_from_checkpoint:
        bad = True  # this update went wrong: the checkpoint saved after it holds it
    if step % 4 == 0:
        ck = out / f"checkpoint-{step}"
        ck.mkdir(parents=True, exist_ok=True)
        header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
        (ck / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
        (ck / "policy.json").write_text(json.dumps({"bad": bad}))
        (ck / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        print(f"Saving model checkpoint to {ck}", flush=True)
    time.sleep(0.3)
"""


def test_a_kl_blowup_back_at_the_same_step_after_a_rollback_goes_further_back(
    tmp_path: Path, stdlib_python: str
) -> None:
    script = tmp_path / "grpo_like.py"
    script.write_text(JOB)
    out, runs = tmp_path / "out", tmp_path / "runs"
    cmd = supervise_cmd(
        [stdlib_python, str(script), "--output_dir", str(out)], out, runs, "came-back", "--preset", "trl"
    )
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]

    events = read_events(runs / "came-back" / "events.jsonl")
    restarts = [e for e in events if e.kind == "action" and e.name == "restart"]
    resumed = [Path(e.data["resume_checkpoint"]).name for e in restarts if e.data.get("resume_checkpoint")]
    # The first rollback takes the newest checkpoint before the trouble it saw; the trouble is back at
    # the same step, so the second goes one checkpoint further back, before the update that did it.
    assert resumed == ["checkpoint-8", "checkpoint-4"], [e.message for e in restarts]
    raised = [e.data["start_step"] for e in events if e.kind == "anomaly" and e.name == "kl_blowup"]
    assert raised == [10, 10]

    # The timeline that completed never had the bad update: its last KL is where the healthy one was.
    last: dict[int, float] = {}
    for rec in iter_records(runs / "came-back" / "telemetry" / "rank-0.jsonl"):
        if isinstance(rec, StepRecord) and rec.extra.get("kl") is not None:
            last[rec.step] = rec.extra["kl"]
    assert max(last) == 24 and last[24] < 1e-5

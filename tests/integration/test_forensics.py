"""Forensics on real runs: which data, which layer, can it be reproduced, is the log intact.

One supervised run is shared: the demo data with one planted bad sample (a prompt
so long that truncation cuts the whole answer off, so every label is masked).
With one sample per step, that step's loss is 0/0 = NaN.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from steadytune.cli.main import main
from steadytune.rundir import RunDir
from steadytune.telemetry.events import read_events

from .runs import STEADYTUNE, finish, run_dir, start_run, steps, write_config

pytestmark = pytest.mark.slow

PLANTED = 23
PLANTED_TEXT = " ".join(["Summarise the following meeting notes carefully and completely."] * 30)


def cli(*args: str, cwd: Path | None = None) -> tuple[int, str]:
    proc = subprocess.run([STEADYTUNE, *args], capture_output=True, text=True, cwd=cwd, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def cli_json(*args: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [STEADYTUNE, *args, "--format", "json"], capture_output=True, text=True, timeout=600
    )
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _in_process(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def here(*args: str) -> tuple[int, str]:
    """:func:`cli` through the CLI's own ``main`` in this process, for a command that a test here runs as
    a subprocess too: a subprocess of ``inspect-batch`` spends most of its life importing what this
    process has imported already (the session's ``demo_assets`` built the model here)."""
    code, out, err = _in_process(*args)
    return code, out + err


def here_json(*args: str) -> tuple[int, dict]:
    """:func:`cli_json` as :func:`here` runs it."""
    code, out, err = _in_process(*args, "--format", "json")
    assert out.strip(), err
    return code, json.loads(out)


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory, demo_assets: Path) -> tuple[RunDir, int]:
    tmp = tmp_path_factory.mktemp("forensics")
    rows = [json.loads(line) for line in (demo_assets / "train.jsonl").read_text().splitlines()[:40]]
    rows.insert(PLANTED, {"instruction": PLANTED_TEXT, "input": "", "output": "Done."})
    data = tmp / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = write_config(
        tmp,
        demo_assets,
        data={"train_file": str(data), "max_seq_length": 96},
        train={"per_device_train_batch_size": 1, "max_steps": len(rows), "save_steps": 10},
    )
    rc, out = finish(start_run(cfg, "planted"))
    assert rc == 0, out
    run = run_dir(cfg, "planted")
    bad = [r.step for r in steps(run) if r.batch and PLANTED in r.batch.indices]
    assert bad, "the planted sample was never trained"
    return run, bad[-1]


def copy_run(run: RunDir, dest: Path) -> RunDir:
    shutil.copytree(run.root, dest / run.root.name, ignore=shutil.ignore_patterns("checkpoints", "final"))
    return RunDir(dest / run.root.name)


def test_planted_sample_turns_its_step_nan_and_inspect_batch_names_it(nan_run):
    run, step = nan_run
    rec = next(r for r in steps(run) if r.step == step)
    assert rec.skipped and rec.loss != rec.loss  # NaN: the guard skipped the update
    assert ("anomaly", "nan_loss", step) in [(e.kind, e.name, e.step) for e in read_events(run.events)]

    rc, v = cli_json("inspect-batch", str(run.root), "--step", str(step))
    assert rc == 0 and v["verdict"] == "bad" and v["culprits"] == [PLANTED]
    checks = [f["check"] for f in v["samples"][0]["findings"]]
    assert checks[:2] == ["all_labels_masked", "truncated"]
    assert v["samples"][0]["recorded_hash"] == v["samples"][0]["current_hash"]
    assert "Summarise" not in json.dumps(v)  # no text unless asked

    rc, text = here("inspect-batch", str(run.root))  # no --step: the step that went wrong
    assert rc == 0 and f"step {step}: BAD — sample {PLANTED} (all_labels_masked; truncated" in text
    assert "Summarise" not in text
    rc, shown = here("inspect-batch", str(run.root), "--step", str(step), "--show-text")
    assert "Summarise the following meeting notes" in shown


def test_inspect_batch_sees_that_the_dataset_changed(nan_run, tmp_path):
    run, step = nan_run
    copy = copy_run(run, tmp_path)
    cfg = yaml.safe_load(copy.config.read_text())
    healthy = next(r for r in steps(run) if r.step != step and r.step > 1)
    rows = Path(cfg["data"]["train_file"]).read_text().splitlines()
    sid = healthy.batch.indices[0]
    row = json.loads(rows[sid])
    row["output"] = row["output"] + " (edited)"
    rows[sid] = json.dumps(row)
    (tmp_path / "edited.jsonl").write_text("\n".join(rows) + "\n")
    cfg["data"]["train_file"] = str(tmp_path / "edited.jsonl")
    copy.config.write_text(yaml.safe_dump(cfg))
    rc, v = here_json("inspect-batch", str(copy.root), "--step", str(healthy.step))
    assert (
        rc == 0
        and v["verdict"] == "bad"
        and v["culprits"] == [sid]
        and v["samples"][0]["findings"][0]["check"] == "hash_mismatch"
    )


def test_diff_ckpt_names_the_layer_with_a_planted_nan(nan_run, tmp_path):
    from safetensors.numpy import load_file, save_file

    run, _ = nan_run
    healthy = run.checkpoints / "checkpoint-20"
    bad = tmp_path / "checkpoint-bad"
    shutil.copytree(healthy, bad)
    tensors = load_file(str(bad / "model.safetensors"))
    tensors["model.layers.1.mlp.down_proj.weight"][3, 7] = float("nan")
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})

    rc, d = cli_json("diff-ckpt", str(healthy), str(bad))
    assert rc == 0 and d["problem_layer"] == "layers.1"
    assert [lay["name"] for lay in d["layers"]][:3] == ["embeddings", "layers.0", "layers.1"]
    assert d["layers"][1]["nonfinite_b"] == 0 and d["layers"][2]["nonfinite_b"] == 1
    rc, text = cli("diff-ckpt", str(run.checkpoints / "checkpoint-10"), str(bad), "--top", "5")
    assert "verdict: problem layer: layers.1" in text and "model.layers.1.mlp.down_proj.weight" in text


def test_repro_check_reproduces_the_nan_and_clears_a_healthy_step(nan_run, tmp_path):
    run, step = nan_run
    rc, out = cli("repro", str(run.root))  # no --step: the step that went wrong
    bundle = run.repro / f"repro-step{step}.tar.gz"
    assert rc == 0 and str(bundle) in out
    with tarfile.open(bundle) as tar:
        names = {
            Path(n).relative_to(Path(n).parts[0]).as_posix() for n in tar.getnames() if len(Path(n).parts) > 1
        }
        blob = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())
    assert {
        "bundle.json",
        "config.yaml",
        "plan.jsonl",
        "environment.json",
        "metrics.jsonl",
        "events.jsonl",
        "replay.py",
        "rng/rng_state.pth",
    } <= names
    assert not any(n.startswith(("data/", "checkpoint/")) for n in names)
    assert b"Summarise" not in blob  # ids and hashes, never the text, unless asked

    rc, res = cli_json("repro", "--check", str(bundle))
    assert rc == 0 and res["verdict"] == "reproduced", res
    assert res["steps"][-1]["step"] == step and res["steps"][-1]["loss"] == "nan"
    assert [(r["sample_id"], r["tokens"], r["mean_loss"]) for r in res["samples"]] == [(PLANTED, 0, None)]

    healthy = next(s for s in range(12, 20) if s != step)
    rc, out = cli("repro", str(run.root), "--step", str(healthy), "-o", str(tmp_path / "healthy.tar.gz"))
    assert rc == 0, out
    # Written outside its run, a bundle (paths redacted by default) is checked with the run named.
    rc, res = cli_json("repro", "--check", str(tmp_path / "healthy.tar.gz"), str(run.root))
    assert rc == 0 and res["verdict"] == "healthy" and all(s["matches"] for s in res["steps"]), res


def test_self_contained_bundle_replays_with_its_own_replay_py(nan_run, tmp_path):
    run, step = nan_run
    out = tmp_path / "full.tar.gz"
    rc, text = cli(
        "repro", str(run.root), "--step", str(step), "--include-data", "--include-checkpoint", "-o", str(out)
    )
    assert rc == 0, text
    with tarfile.open(out) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    folder = next((tmp_path / "x").iterdir())
    assert (folder / "data" / "samples.jsonl").exists() and any((folder / "checkpoint").iterdir())
    proc = subprocess.run(
        [sys.executable, str(folder / "replay.py")], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr


def test_replay_equals_what_happened_live(nan_run):
    run, step = nan_run
    rc, res = cli_json("replay", str(run.root))
    assert rc == 0 and res["matches_live"], res
    assert ["anomaly", "nan_loss", step] in res["recorded"]
    assert res["replayed"] == res["recorded"]


def test_replay_equals_live_across_a_rollback_and_reads_the_attempt_that_spiked(tmp_path, demo_assets):
    cfg = write_config(tmp_path, demo_assets, train={"max_steps": 60, "save_steps": 10})
    rc, out = finish(start_run(cfg, "burst", faults={"lr_burst_at_step": 35}))
    assert rc == 0, out
    run = run_dir(cfg, "burst")
    events = read_events(run.events)
    assert "rollback" in [e.name for e in events if e.kind == "action"], [e.name for e in events]
    rc, res = cli_json("replay", str(run.root))
    assert rc == 0 and res["matches_live"], res
    assert any(k[0] == "resolved" for k in res["recorded"])  # anomalies cleared by the restart, replayed too

    spiked = next(
        e.step for e in events if e.kind == "anomaly" and e.name in {"loss_spike", "grad_explosion"}
    )
    attempts = sorted({r.attempt for r in steps(run) if r.step == spiked})
    # The step was trained again after the rollback: by attempt 1 in process, or, where the worker
    # reached its last step before it took the request (a loaded machine), by the restart after it.
    assert len(attempts) == 2 and attempts[0] == 0, attempts
    retrained = attempts[1]
    rc, v = here_json("inspect-batch", str(run.root))
    assert v["step"] == spiked and v["attempt"] == 0  # the attempt that went wrong, not the retrained one
    rc, v = here_json("inspect-batch", str(run.root), "--step", str(spiked), "--attempt", str(retrained))
    assert v["attempt"] == retrained

    # The burst was an LR change outside the schedule: the replay applies the recorded LR and says so.
    rc, out = cli("repro", str(run.root), "--step", str(spiked))
    assert rc == 0, out
    rc, res = cli_json("repro", "--check", str(run.repro / f"repro-step{spiked}.tar.gz"))
    assert rc == 0 and res["verdict"] == "reproduced", res
    assert any("changed outside the schedule" in n for n in res["notes"])


def test_audit_verify_passes_on_the_run_and_fails_on_each_tampering(nan_run, tmp_path):
    run, _ = nan_run
    rc, out = cli("audit", "verify", str(run.root))
    assert rc == 0 and "chain: OK" in out and "tail: OK" in out, out

    def tampered(name: str, change) -> str:
        copy = copy_run(run, tmp_path / name)
        rows = copy.events.read_text().splitlines()
        copy.events.write_text("\n".join(change(rows)) + "\n")
        rc, out = cli("audit", "verify", str(copy.root))
        assert rc == 1, out
        return out

    def edit(rows):
        entry = json.loads(rows[3])
        entry["message"] = "all good"
        return [*rows[:3], json.dumps(entry, separators=(",", ":")), *rows[4:]]

    assert "edited: line 4" in tampered("edit", edit)
    assert "deleted: line 4" in tampered("delete", lambda rows: rows[:3] + rows[4:])
    assert "reordered: line 3" in tampered("reorder", lambda rows: [*rows[:2], rows[3], rows[2], *rows[4:]])
    assert "truncated" in tampered("truncate", lambda rows: rows[:-2])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak RSS from /proc")
def test_diff_ckpt_streams_two_200mb_checkpoints_in_bounded_memory(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    for name, seed in (("a", 0), ("b", 1)):
        rng = np.random.default_rng(seed)
        save_file(
            {
                f"model.layers.{i}.mlp.up_proj.weight": rng.standard_normal((2500, 2500), dtype=np.float32)
                for i in range(8)
            },
            str(tmp_path / f"{name}.safetensors"),
        )
    total = sum((tmp_path / f"{n}.safetensors").stat().st_size for n in "ab")
    assert total >= 400_000_000  # 2 x 200 MB
    # VmHWM is the peak RSS of this process image; ru_maxrss would also count the forked pytest parent.
    code = (
        "import re, sys; from steadytune.cli.main import main; "
        f"rc = main(['diff-ckpt', {str(tmp_path / 'a.safetensors')!r}, "
        f"{str(tmp_path / 'b.safetensors')!r}]); "
        "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1); "
        "print('PEAK_KB', hwm); sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    peak = int(proc.stdout.split("PEAK_KB")[1].split()[0]) * 1024
    assert "layers.7" in proc.stdout
    assert peak < 0.35 * total, (
        f"peak RSS {peak / 1024**2:.0f} MiB for {total / 1024**2:.0f} MiB of checkpoints"
    )


LEAKER = """
import sys, time
hoard = []
print("ready", flush=True)
while True:
    hoard.append(bytearray(2 * 1024 * 1024))  # never freed: a leak of 2 MiB per step
    time.sleep(0.05)
"""
STEADY = """
import time
buf = bytearray(50 * 1024 * 1024)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("program, leaks", [(LEAKER, True), (STEADY, False)], ids=["leak", "steady"])
def test_mem_profile_flags_a_deliberate_leak(program, leaks, tmp_path):
    child = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        plot = tmp_path / "mem.png"
        proc = subprocess.run(
            [
                STEADYTUNE,
                "mem-profile",
                "--pid",
                str(child.pid),
                "--seconds",
                "3",
                "--interval",
                "0.1",
                "--plot",
                str(plot),
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
        )
        rep = json.loads(proc.stdout)
        assert rep["leak_suspected"] is leaks and proc.returncode == (1 if leaks else 0)
        rss = next(s for s in rep["series"] if s["name"] == "rss")
        assert rss["growing"] is leaks
        assert plot.exists() and plot.stat().st_size > 1000
    finally:
        child.kill()
        child.wait()

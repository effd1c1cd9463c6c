"""The guard injected into trainers that are not ours: a plain HF script, the TRL and LLaMA-Factory CLIs.

Each test starts the tool as a real process with ``inject_env`` applied (no supervisor)
and reads what the guard wrote into the run directory.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from steadytune.data.encode import sample_hash
from steadytune.inject import inject_env
from steadytune.protocol import send_control
from steadytune.records import Event, StepRecord, WorkerExit
from steadytune.rundir import RunDir
from steadytune.supervise.logparse import parse_log_line
from steadytune.telemetry.stream import iter_records
from tests.tools import tool_venv

from .hfjob import hf_script
from .runs import wait_for

pytestmark = pytest.mark.slow


def _env(run: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEADYTUNE_INJECT")}
    base.pop("STEADYTUNE_FAULTS", None)
    return {**base, **inject_env(run, 0, base), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}


def _records(run: Path) -> list:
    return list(iter_records(RunDir(run).telemetry(0)))


def _steps(run: Path) -> list[StepRecord]:
    return [r for r in _records(run) if isinstance(r, StepRecord)]


def _events(run: Path, name: str) -> list[Event]:
    return [r for r in _records(run) if isinstance(r, Event) and r.name == name]


def _exit(run: Path) -> WorkerExit:
    exits = [r for r in _records(run) if isinstance(r, WorkerExit)]
    assert len(exits) == 1, exits
    return exits[0]


def _script_hashes(demo_assets: Path) -> set[str]:
    """Every sample of the script's data, tokenized as the script does, hashed as the guard does."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(demo_assets / "model")
    with open(demo_assets / "train.jsonl") as f:
        rows = [json.loads(line) for line in f][:400]
    texts = [f"{r['instruction']}\n{r['input']}\n{r['output']}" for r in rows]
    return {f"{sample_hash(tok(t, truncation=True, max_length=64)['input_ids']):015x}" for t in texts}


def test_a_plain_script_gets_pre_clip_norms_fingerprints_and_last_words(
    tmp_path: Path, demo_assets: Path
) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    done = subprocess.run(hf_script(demo_assets, out, "--max_steps", "12", "--save_steps", "5"),
                          env=_env(run), capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "steadytune:" not in done.stderr
    steps = _steps(run)
    assert [r.step for r in steps] == list(range(1, 13))
    # HF logs the norm clipping returned, before it scaled the gradients (max_grad_norm is 1.0 here):
    # the guard's records hold the same numbers, well above the clipped value.
    logged = [d["grad_norm"] for d in map(parse_log_line, done.stdout.splitlines()) if d and "grad_norm" in d]
    assert len(logged) == 12
    for rec, hf in zip(steps, logged, strict=True):
        assert rec.grad_norm is not None and math.isfinite(rec.grad_norm)
        assert rec.grad_norm == pytest.approx(hf, rel=2e-3)
    assert max(r.grad_norm for r in steps) > 2.0
    known = _script_hashes(demo_assets)
    for rec in steps:
        assert rec.batch is not None and rec.batch.indices == () and len(rec.batch.hashes) == 8 == rec.samples
        assert set(rec.batch.hashes) <= known  # each hash is of a sample as tokenized, padding left out
        assert rec.loss is not None and rec.tokens and rec.lr is not None and not rec.skipped
    begin = _events(run, "train_begin")[0]
    assert begin.data["max_steps"] == 12 and begin.data["start_step"] == 0
    assert "transformers.trainer.Trainer" in _events(run, "guard_injected")[0].message
    saved = [(e.step, e.data["path"]) for e in _events(run, "checkpoint_saved")]
    assert saved == [(s, str(out.resolve() / f"checkpoint-{s}")) for s in (5, 10, 12)]  # the tool's own saves
    last = _exit(run)
    assert last.status == "completed" and last.step == 12


def test_a_nan_step_is_skipped_before_the_update(tmp_path: Path, demo_assets: Path) -> None:
    from safetensors.torch import load_file

    run, out = tmp_path / "run", tmp_path / "out"
    env = _env(run, STEADYTUNE_FAULTS=json.dumps({"nan_at_step": 4}))
    done = subprocess.run(hf_script(demo_assets, out, "--max_steps", "5", "--save_steps", "1"),
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    skips = _events(run, "skip_step")
    assert [e.step for e in skips] == [4]
    steps = {r.step: r for r in _steps(run)}
    assert steps[4].skipped and math.isnan(steps[4].loss) and math.isnan(steps[4].grad_norm)
    assert not any(steps[s].skipped for s in (1, 2, 3, 5))
    before, at, after = (load_file(out / f"checkpoint-{s}" / "model.safetensors") for s in (3, 4, 5))
    assert all(v.isfinite().all() for v in after.values())
    assert all(before[k].equal(at[k]) for k in before)  # the poisoned step left every weight as it was
    assert not all(at[k].equal(after[k]) for k in at)  # and training went on
    assert _exit(run).status == "completed"


@pytest.mark.parametrize("command", ["stop", "pause"])
def test_a_control_request_saves_and_ends_the_tools_training(
    tmp_path: Path, demo_assets: Path, command: str
) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    cmd = hf_script(demo_assets, out, "--max_steps", "400", "--save_steps", "1000", "--step_sleep", "0.2")
    proc = subprocess.Popen(cmd, env=_env(run), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(
            lambda: RunDir(run).telemetry(0).exists() and len(_steps(run)) >= 2, timeout=300, what="2 steps"
        )
        send_control(RunDir(run), "checkpoint", "test")
        first = wait_for(
            lambda: _events(run, "checkpoint_saved"), timeout=120, what="the requested checkpoint"
        )
        assert proc.poll() is None  # a checkpoint request does not end training
        send_control(RunDir(run), command, "test")
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert [e.data["issuer"] for e in _events(run, f"ack_{command}")] == ["test"]
    saved = _events(run, "checkpoint_saved")
    last = _exit(run)
    assert last.status == ("paused" if command == "pause" else "stopped") and 2 <= last.step < 400
    assert [e.step for e in saved] == [first[0].step, last.step]
    state = json.loads((Path(saved[-1].data["path"]) / "trainer_state.json").read_text())
    assert state["global_step"] == last.step


def test_a_bad_fault_spec_leaves_the_tool_alone(tmp_path: Path, demo_assets: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    env = _env(run, STEADYTUNE_FAULTS=json.dumps({"nan_at_stpe": 4}))
    done = subprocess.run(hf_script(demo_assets, out, "--max_steps", "3"),
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("steadytune:")]
    assert len(said) == 1, done.stderr[-3000:]
    assert said[0].startswith("steadytune: guard not injected: ValueError: unknown fault(s) ['nan_at_stpe']")
    assert (out / "checkpoint-3").is_dir() and not RunDir(run).telemetry(0).exists()


# steadytune's own code is refused these imports in the child (even of modules the tool has loaded):
# the injected guard must do without them.
_BLOCKER = """
import builtins, runpy, sys
REFUSED = {"pydantic", "yaml", "rich", "psutil"}
real_import = builtins.__import__
def refusing_import(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {}).get("__name__", "")
    if level == 0 and name.split(".")[0] in REFUSED and importer.startswith("steadytune"):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return real_import(name, globals, locals, fromlist, level)
builtins.__import__ = refusing_import
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
print("@@steadytune-modules", sorted(m for m in sys.modules if m.startswith("steadytune")))
"""


@pytest.mark.tools("trl")
def test_the_guard_needs_nothing_but_torch_and_transformers(tmp_path: Path, demo_assets: Path) -> None:
    """In the TRL tool's own venv, with steadytune refused pydantic, yaml, rich and psutil."""
    run, out = tmp_path / "run", tmp_path / "out"
    python = str(tool_venv("trl") / "python")
    cmd = [python, "-c", _BLOCKER, *hf_script(demo_assets, out, "--max_steps", "3")[1:]]
    done = subprocess.run(cmd, env=_env(run), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "steadytune:" not in done.stderr
    steps = _steps(run)
    assert [r.step for r in steps] == [1, 2, 3] and all(r.grad_norm and r.batch for r in steps)
    # psutil refused: RSS still comes from /proc/<pid>/statm where there is one; elsewhere it is
    # missing, not an error.
    assert all((r.rss_bytes is not None) == Path("/proc/self/statm").exists() for r in steps)
    loaded = next(x for x in done.stdout.splitlines() if x.startswith("@@steadytune-modules"))
    assert "steadytune.config" not in loaded and "steadytune.supervise" not in loaded
    assert _exit(run).status == "completed"


def _trl_data(demo_assets: Path, folder: Path) -> Path:
    """The demo set as TRL's prompt/completion conversations."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(demo_assets / "train.jsonl") as fin, open(folder / "train.jsonl", "w") as fout:
        for line in list(fin)[:200]:
            r = json.loads(line)
            prompt = [{"role": "user", "content": f"{r['instruction']} {r['input']}"}]
            completion = [{"role": "assistant", "content": r["output"]}]
            fout.write(json.dumps({"prompt": prompt, "completion": completion}) + "\n")
    return folder


def _assert_guarded_steps(run: Path, steps: int, trainer: str) -> None:
    recs = _steps(run)
    assert [r.step for r in recs] == list(range(1, steps + 1))
    assert all(r.grad_norm is not None and math.isfinite(r.grad_norm) and r.batch and r.loss for r in recs)
    assert trainer in _events(run, "guard_injected")[0].message
    assert _events(run, "train_begin")[0].data["max_steps"] == steps
    assert _exit(run).status == "completed"


@pytest.mark.tools("trl")
def test_the_trl_cli_trains_with_the_guard(tmp_path: Path, demo_assets: Path) -> None:
    trl = tool_venv("trl") / "trl"
    run, out, steps = tmp_path / "run", tmp_path / "out", 6
    cmd = [str(trl), "sft", "--model_name_or_path", str(demo_assets / "model"),
           "--dataset_name", str(_trl_data(demo_assets, tmp_path / "data")), "--dataset_train_split", "train",
           "--output_dir", str(out), "--max_steps", str(steps), "--save_steps", "3", "--logging_steps", "3",
           "--per_device_train_batch_size", "4", "--learning_rate", "1e-4", "--report_to", "none",
           "--use_cpu", "true"]  # fmt: skip
    done = subprocess.run(cmd, env=_env(run), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "steadytune:" not in done.stderr
    _assert_guarded_steps(run, steps, "SFTTrainer")
    saved = [e.data["path"] for e in _events(run, "checkpoint_saved")]
    assert saved == [str(out.resolve() / f"checkpoint-{s}") for s in (3, 6)]


@pytest.mark.tools("llamafactory")
def test_the_llamafactory_cli_trains_with_the_guard(tmp_path: Path, demo_assets: Path) -> None:
    cli = tool_venv("llamafactory") / "llamafactory-cli"
    run, steps = tmp_path / "run", 6
    data = tmp_path / "data"
    data.mkdir()
    with open(demo_assets / "train.jsonl") as f:
        (data / "demo.json").write_text(json.dumps([json.loads(line) for line in list(f)[:200]]))
    columns = {"prompt": "instruction", "query": "input", "response": "output"}
    (data / "dataset_info.json").write_text(
        json.dumps({"demo": {"file_name": "demo.json", "columns": columns}})
    )
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(
        f"model_name_or_path: {demo_assets / 'model'}\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
        f"lora_target: all\ndataset: demo\ndataset_dir: {data}\ntemplate: default\ncutoff_len: 64\n"
        f"output_dir: {tmp_path / 'out'}\nlogging_steps: 3\nsave_steps: 3\nmax_steps: {steps}\n"
        "per_device_train_batch_size: 4\nlearning_rate: 1.0e-4\nreport_to: none\nuse_cpu: true\n"
    )
    done = subprocess.run(
        [str(cli), "train", str(cfg)], env=_env(run), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "steadytune:" not in done.stderr
    _assert_guarded_steps(run, steps, "CustomSeq2SeqTrainer")

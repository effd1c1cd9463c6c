"""The real TRL, LLaMA-Factory, axolotl and ms-swift CLIs, and `accelerate launch`, on the demo model,
run under `steadytune supervise`.

A :class:`ToolJob` is one tool's command line for a small SFT job (its own flags, or its
own YAML), or a TRL DPO or GRPO job on the demo's preference rows and prompts;
:func:`supervise` starts `steadytune supervise` around it as a real process and hands
back a :class:`Supervised` that reads the run directory. Whatever a test leaves
running — the supervisor, the tool's launcher, its trainer, in a session of their
own — is killed when the test ends, pass or fail: an orphaned trainer would slow
every later test on a small machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from steadytune.records import Event, StepRecord
from steadytune.telemetry.events import read_events
from steadytune.telemetry.stream import iter_records
from tests.tools import tool_venv

from .hfjob import hf_script, supervise_cmd
from .runs import wait_for

TOOLS = ("trl", "llamafactory")
# Launched through accelerate (or a launcher of their own), with no TRL or LLaMA-Factory in between.
LAUNCHED = ("axolotl", "swift", "accelerate")


@dataclass
class ToolJob:
    """One tool's training command, the folder it writes checkpoints to, and its LR."""

    tool: str  # the run's name; also the `supervise --preset` that knows its flags, unless preset says
    cmd: list[str]
    out: Path
    lr: float
    weights_file: str  # the weights a checkpoint holds: the full model, or the LoRA adapter
    env: dict[str, str] = field(default_factory=dict)  # what the job needs in its environment
    # A word of the training processes' command lines; None: the command itself trains.
    trainer_mark: str | None = None
    preset: str = ""

    def trainers(self, worker_pid: int) -> list[psutil.Process]:
        """The processes that train, below the command's own: `trl sft|dpo|grpo` runs
        trl/scripts/<name>.py through accelerate, `axolotl train` execs `accelerate launch -m
        axolotl.cli.train`, `swift sft` runs swift/cli/sft.py, `accelerate launch --num_processes 2`
        one per rank; `llamafactory-cli train` on one device trains in its own process."""
        try:
            root = psutil.Process(worker_pid)
            if self.trainer_mark is None:
                return [root]
            found = {p.pid: p.cmdline() for p in root.children(recursive=True)}
            marked = {pid: cmd for pid, cmd in found.items() if self.trainer_mark in " ".join(cmd)}
            # A trainer's data-loader workers are forks of it, with its very command line: not trainers.
            return [
                proc
                for proc in (psutil.Process(pid) for pid in marked)
                if marked.get(proc.ppid()) != marked[proc.pid]
            ]
        except psutil.Error:
            return []

    def trainer(self, worker_pid: int) -> psutil.Process | None:
        found = self.trainers(worker_pid)
        return found[0] if found else None

    def checkpoint(self, step: int) -> Path:
        return self.out / f"checkpoint-{step}"

    def checkpoints(self) -> list[int]:
        """Steps of the checkpoints in the output folder, oldest first."""
        return sorted(int(p.name.split("-")[1]) for p in self.out.glob("checkpoint-*"))


def demo_rows(demo_assets: Path, rows: int = 400) -> list[dict[str, str]]:
    """The first ``rows`` demo samples (instruction, input, output)."""
    with open(demo_assets / "train.jsonl") as f:
        return [json.loads(line) for line in list(f)[:rows]]


def sft_data(demo_assets: Path, folder: Path, rows: int = 400) -> Path:
    """The demo set as TRL's prompt/completion conversations."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.jsonl", "w") as fout:
        for r in demo_rows(demo_assets, rows):
            user = {"role": "user", "content": f"{r['instruction']} {r['input']}"}
            fout.write(
                json.dumps({"prompt": [user], "completion": [{"role": "assistant", "content": r["output"]}]})
            )
            fout.write("\n")
    return folder


def _conversation(row: dict[str, str]) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{row['instruction']} {row['input']}"}]


def preference_data(folder: Path, rows: int = 200) -> Path:
    """The demo's preference rows as TRL's conversational prompt/chosen/rejected."""
    from steadytune.train.assets import generate_preferences

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.jsonl", "w") as fout:
        for r in generate_preferences(rows, seed=1):
            answer = {"chosen": r["chosen"], "rejected": r["rejected"]}
            turns = {k: [{"role": "assistant", "content": v}] for k, v in answer.items()}
            fout.write(json.dumps({"prompt": _conversation(r), **turns}) + "\n")
    return folder


def prompt_data(demo_assets: Path, folder: Path, rows: int = 200) -> Path:
    """The demo instructions as TRL's conversational prompts, for GRPO."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.jsonl", "w") as fout:
        for r in demo_rows(demo_assets, rows):
            fout.write(json.dumps({"prompt": _conversation(r)}) + "\n")
    return folder


# GRPO on the demo model: groups of 4 short completions, scored by the demo's brevity reward (imported
# by TRL from steadytune, found on the PYTHONPATH the job gets); a KL term, so that TRL logs `kl`.
GRPO_FLAGS = {"num_generations": 4, "max_completion_length": 16, "beta": 0.04,
              "reward_funcs": "steadytune.train.assets.brevity_reward"}  # fmt: skip


def common_args(
    steps: int, save_steps: int, logging_steps: int, lr: float, extra: dict[str, Any]
) -> dict[str, Any]:
    """The HF training arguments both tools take under the same names, CPU-only and unreported."""
    return {"max_steps": steps, "save_steps": save_steps, "logging_steps": logging_steps,
            "per_device_train_batch_size": 4, "learning_rate": f"{lr:e}", "report_to": "none",
            "use_cpu": "true", **extra}  # fmt: skip


def trl_job(
    demo_assets: Path,
    tmp: Path,
    steps: int,
    save_steps: int = 50,
    logging_steps: int = 5,
    lr: float = 1e-4,
    trainer: str = "sft",
    **extra: Any,
) -> ToolJob:
    """`trl sft|dpo|grpo` as its users call it, full fine-tuning; ``extra`` are more of its --flags."""
    out = tmp / "out"
    env: dict[str, str] = {}
    if trainer == "dpo":
        data = preference_data(tmp / "data")
    elif trainer == "grpo":
        data = prompt_data(demo_assets, tmp / "data")
        extra = {**GRPO_FLAGS, **extra}
        import steadytune

        env["PYTHONPATH"] = str(Path(steadytune.__file__).resolve().parents[1])
    else:
        data = sft_data(demo_assets, tmp / "data")
    flags = {"save_total_limit": 3, **common_args(steps, save_steps, logging_steps, lr, extra)}
    cmd = [
        str(tool_venv("trl") / "trl"),
        trainer,
        "--model_name_or_path",
        str(demo_assets / "model"),
        "--dataset_name",
        str(data),
        "--dataset_train_split",
        "train",
        "--output_dir",
        str(out),
    ]
    for key, value in flags.items():
        cmd += [f"--{key}", str(value)]
    return ToolJob("trl", cmd, out, lr, "model.safetensors", env, trainer_mark=f"{trainer}.py")


def lf_job(
    demo_assets: Path,
    tmp: Path,
    steps: int,
    save_steps: int = 50,
    logging_steps: int = 5,
    lr: float = 1e-4,
    **extra: Any,
) -> ToolJob:
    """`llamafactory-cli train sft.yaml`, LoRA, with a YAML as its users write them; ``extra`` are
    more of its keys."""
    data = tmp / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "demo.json").write_text(json.dumps(demo_rows(demo_assets)))
    columns = {"prompt": "instruction", "query": "input", "response": "output"}
    (data / "dataset_info.json").write_text(
        json.dumps({"demo": {"file_name": "demo.json", "columns": columns}})
    )
    out = tmp / "out"
    keys = {"model_name_or_path": demo_assets / "model", "stage": "sft", "do_train": "true",
            "finetuning_type": "lora", "lora_target": "all", "dataset": "demo", "dataset_dir": data,
            "template": "default", "cutoff_len": 64, "output_dir": out,
            **common_args(steps, save_steps, logging_steps, lr, extra)}  # fmt: skip
    cfg = tmp / "sft.yaml"
    cfg.write_text("".join(f"{k}: {v}\n" for k, v in keys.items()))
    cmd = [str(tool_venv("llamafactory") / "llamafactory-cli"), "train", str(cfg)]
    return ToolJob("llamafactory", cmd, out, lr, "adapter_model.safetensors")


def swift_job(
    demo_assets: Path,
    tmp: Path,
    steps: int,
    save_steps: int = 50,
    logging_steps: int = 5,
    lr: float = 1e-4,
    **extra: Any,
) -> ToolJob:
    """`swift sft` (ms-swift), LoRA, on the demo rows as they are: it reads instruction/input/output.

    The demo model is no model it knows by name, so its type and template are given; one output
    folder (``--add_version false``: the preset needs it), and no look-up of the model on its hub.
    """
    data = tmp / "data"
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "train.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in demo_rows(demo_assets))
    out = tmp / "out"
    flags = {"model": demo_assets / "model", "model_type": "llama", "template": "default",
             "dataset": data / "train.jsonl", "tuner_type": "lora", "max_length": 64, "output_dir": out,
             "add_version": "false", "check_model": "false", "dataset_num_proc": 1,
             **common_args(steps, save_steps, logging_steps, lr, extra)}  # fmt: skip
    cmd = [str(tool_venv("swift") / "swift"), "sft"]
    for key, value in flags.items():
        cmd += [f"--{key}", str(value)]
    return ToolJob("swift", cmd, out, lr, "adapter_model.safetensors", trainer_mark="swift/cli/sft.py")


def axolotl_job(
    demo_assets: Path,
    tmp: Path,
    steps: int,
    save_steps: int = 50,
    logging_steps: int = 5,
    lr: float = 1e-4,
    **extra: Any,
) -> ToolJob:
    """`axolotl train config.yml`, full fine-tuning, with a YAML as its users write them; ``extra`` are
    more of its keys. Its CLI execs `accelerate launch` by name, found on the PATH of the venv."""
    data = tmp / "data"
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "train.jsonl", "w") as f:
        for r in demo_rows(demo_assets):
            f.write(json.dumps({"text": f"{r['instruction']}\n{r['input']}\n{r['output']}"}) + "\n")
    out = tmp / "out"
    keys = {"base_model": demo_assets / "model", "output_dir": out, "dataset_prepared_path": tmp / "prepared",
            "val_set_size": 0, "sequence_len": 64, "micro_batch_size": 4, "gradient_accumulation_steps": 1,
            "max_steps": steps, "save_steps": save_steps, "logging_steps": logging_steps,
            "learning_rate": lr, "optimizer": "adamw_torch", "lr_scheduler": "cosine",
            "bf16": "false", "fp16": "false", "tf32": "false", "dataset_processes": 1, **extra}  # fmt: skip
    cfg = tmp / "axolotl.yml"
    cfg.write_text(
        "".join(f"{k}: {v}\n" for k, v in keys.items())
        + f"datasets:\n  - path: {data / 'train.jsonl'}\n    type: completion\n    ds_type: json\n"
    )
    bin_dir = tool_venv("axolotl")
    # AXOLOTL_DO_NOT_TRACK: its telemetry is on unless turned off, and this machine reaches no such host.
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "AXOLOTL_DO_NOT_TRACK": "1"}
    cmd = [str(bin_dir / "axolotl"), "train", str(cfg)]
    return ToolJob("axolotl", cmd, out, lr, "model.safetensors", env, trainer_mark="axolotl.cli.train")


def accelerate_job(
    demo_assets: Path,
    tmp: Path,
    steps: int,
    save_steps: int = 50,
    logging_steps: int = 5,
    lr: float = 1e-4,
    **extra: Any,
) -> ToolJob:
    """`accelerate launch --num_processes 2` of the plain HF Trainer script: two ranks on the CPU, gloo.

    accelerate starts several processes only for a distributed type; without a GPU that is the
    torchrun launcher it uses for several GPUs (``--multi_gpu``), while the script's ``use_cpu``
    picks gloo. A port of its own, so that two such jobs at once do not meet.
    """
    out = tmp / "out"
    launch = [str(Path(sys.executable).parent / "accelerate"), "launch", "--multi_gpu",
              "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
              "--dynamo_backend", "no", "--main_process_port", str(_free_port())]  # fmt: skip
    script = hf_script(demo_assets, out, "--max_steps", str(steps), "--save_steps", str(save_steps),
                       "--logging_steps", str(logging_steps), "--learning_rate", f"{lr:g}",
                       *(x for k, v in extra.items() for x in (f"--{k}", str(v))))  # fmt: skip
    return ToolJob(
        "accelerate", [*launch, *script[1:]], out, lr, "model.safetensors",
        trainer_mark="hf_trainer_script.py", preset="hf",
    )  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_JOBS = {"trl": trl_job, "llamafactory": lf_job, "swift": swift_job, "axolotl": axolotl_job,
         "accelerate": accelerate_job}  # fmt: skip


def tool_job(tool: str, demo_assets: Path, tmp: Path, steps: int, **kw: Any) -> ToolJob:
    return _JOBS[tool](demo_assets, tmp, steps, **kw)


@dataclass
class Supervised:
    """A `steadytune supervise` process around a tool's job, and what its run directory says."""

    proc: subprocess.Popen
    run: Path
    job: ToolJob
    stdout: str = ""
    pids: set[int] = field(default_factory=set)  # every process of its tree the test has seen

    def events(self) -> list[Event]:
        return read_events(self.run / "events.jsonl")

    def named(self, name: str) -> list[Event]:
        return [e for e in self.events() if e.name == name]

    def status(self) -> dict[str, Any]:
        try:
            return json.loads((self.run / "status.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def steps(self) -> list[StepRecord]:
        return [
            r
            for r in iter_records(self.run / "telemetry" / "rank-0.jsonl")
            if isinstance(r, StepRecord) and r.loss is not None
        ]

    def worker(self) -> int:
        """The pid of the tool's command (its launcher), once the supervisor has started it."""
        return wait_for(
            lambda: self.alive() and self.status().get("worker_pid"), timeout=120, what="worker pid"
        )

    def trainer(self) -> psutil.Process:
        found = wait_for(lambda: self.job.trainer(self.worker()), timeout=120, what="the trainer process")
        self.note()
        return found

    def wait_checkpoint(self, step: int, timeout: float = 300) -> Path:
        """The job's checkpoint-``step``, once its trainer_state.json (written last but one) is there."""
        ckpt = self.job.checkpoint(step)
        wait_for(
            lambda: self.alive() and (ckpt / "trainer_state.json").exists(), timeout=timeout, what=ckpt.name
        )
        self.note()
        return ckpt

    def note(self) -> None:
        """Remember the tree's pids now, to prove later that none outlived the run."""
        try:
            self.pids.update(p.pid for p in psutil.Process(self.proc.pid).children(recursive=True))
        except psutil.Error:
            pass

    def alive(self) -> bool:
        """True while the supervisor runs; once it has ended, fails with its output."""
        if self.proc.poll() is None:
            return True
        out = self.proc.stdout.read() if self.proc.stdout else ""
        raise AssertionError(
            f"supervise exited ({self.proc.returncode}) while the test waited:\n{out[-4000:]}"
        )

    def finish(self, timeout: float = 600) -> int:
        self.stdout, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode

    def survivors(self) -> list[int]:
        """Pids of the tree, as noted, that still run (zombies are dead: they only wait to be reaped)."""
        left = []
        for pid in sorted(self.pids):
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left.append(pid)
            except psutil.Error:
                continue
        return left


@contextmanager
def supervise(job: ToolJob, tmp: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Supervised]:
    """`steadytune supervise --preset PRESET --output-dir OUT ARGS -- JOB` as a real process."""
    cmd = supervise_cmd(job.cmd, job.out, tmp / "runs", job.tool, "--preset", job.preset or job.tool, *args)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **job.env, **(env or {})}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env)
    sup = Supervised(proc, tmp / "runs" / job.tool, job)
    try:
        yield sup
    finally:
        _kill_all(sup)


def _kill_all(sup: Supervised) -> None:
    sup.note()
    if sup.proc.poll() is None:
        sup.proc.kill()
        sup.proc.communicate(timeout=30)
    for pid in sup.survivors():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def alerts_config(tmp: Path, url_env: str, **policy: Any) -> Path:
    """A supervise --config whose alerts go to a generic webhook at $``url_env``; ``policy`` keys added."""
    lines = ["policy:\n", *(f"  {k}: {v}\n" for k, v in policy.items())] if policy else []
    lines += [
        "alerts:\n  sinks:\n",
        f"    - type: webhook\n      format: generic\n      url_env: {url_env}\n",
    ]
    cfg = tmp / "supervise.yaml"
    cfg.write_text("".join(lines))
    return cfg


def all_finite(path: Path) -> bool:
    """Every tensor of a safetensors file is finite (torch only here, in the test process)."""
    import torch
    from safetensors.torch import load_file

    return all(bool(torch.isfinite(t).all()) for t in load_file(str(path)).values())

"""``env.json``: the environment a run started in, so it can be compared and rebuilt.

Written in two steps, each atomically (a reader sees the old file or the new one):

1. the supervisor, before the first worker starts (:func:`write_run_env`): Python,
   every package, the driver and GPUs (NVML), and the git state of the working
   tree. The supervisor never imports torch; the worker runs under the same
   interpreter (:func:`steadytune.supervise.process.worker_command`), so these are
   the worker's packages too. A worker that cannot even import torch still leaves
   this behind, which is when it is wanted most;
2. the worker, rank 0 of its first attempt (:func:`add_worker_details`): torch's own
   readings (CUDA build, cuDNN, NCCL, the devices it sees), taken where torch is
   already imported.

For ``supervise -- CMD`` the command's interpreter is read by running the snapshot
script under it (:func:`write_command_env`), torch's build read from its files, not
imported: importing it there would cost seconds before the command itself imports it.
With ``--inject``, the guard in the command's rank 0 adds torch's own readings to
``command.torch`` as the native worker does. The document (``version`` 1)::

    {"version": 1, "ts": ..., "written_by": "supervisor" | "supervise",
     "python": {...}, "os": {...}, "key_packages": {...}, "packages": ["name==version", ...],
     "local_packages": {...}, "torch": {...}, "nvml": {"driver": ..., "gpus": [...]},
     "env": {...}, "git": {...} | null,
     "command": {"interpreter": ..., <the same readings, of the command's Python>}   (supervise only)}
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from steadytune.regularfile import read_text
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.envsnap import snapshot, snapshot_of
from steadytune.telemetry.gitstate import git_state

ENV_VERSION = 1


class EnvError(ValueError):
    """A run has no readable env.json; the message says which run and why."""


def config_sources(cfg: Any, cwd: Path | None = None) -> list[Path]:
    """Where to look for the user's git working tree: the working folder, then the data and local model.

    The worker runs in the folder the run was started from, and a config's relative
    paths resolve next to it, so these are where "the config or script" lives.
    """
    out = [cwd or Path.cwd()]
    for value in (cfg.data.train_file, cfg.data.eval_file, cfg.model.name_or_path):
        if value and Path(value).is_absolute() and Path(value).exists():
            out.append(Path(value))
    return out


def run_env(sources: Sequence[Path] = (), clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """This interpreter's environment (torch left out of this process) plus the git state of ``sources``."""
    return {
        "version": ENV_VERSION,
        "ts": clock(),
        **snapshot(with_torch=False),
        "git": git_state(sources) if sources else None,
    }


def write_env(run: RunDir, env: dict[str, Any]) -> Path:
    atomic_write_text(run.env, json.dumps(env, indent=1, default=str) + "\n")
    return run.env


def write_run_env(run: RunDir, sources: Sequence[Path] = ()) -> Path:
    """The supervisor's half of ``env.json``; called once, when a run starts.

    A reading that fails is recorded as ``error``: the record must never stop the run.
    """
    try:
        env = run_env(sources)
    except Exception as exc:
        env = {"version": ENV_VERSION, "ts": time.time(), "error": f"{type(exc).__name__}: {exc}"}
    return write_env(run, {**env, "written_by": "supervisor"})


def read_run_env(run: RunDir) -> dict[str, Any]:
    """A run's ``env.json``.

    Raises:
        EnvError: the run has none (made before steadytune wrote one) or it is not JSON.
    """
    try:
        data = json.loads(read_text(run.env))
    except FileNotFoundError:
        raise EnvError(
            f"{run.root} has no env.json: it was made by a steadytune that did not record its environment"
        ) from None
    except (OSError, ValueError) as exc:
        raise EnvError(f"{run.env} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise EnvError(f"{run.env} is not a JSON object")
    return data


def add_worker_details(run: RunDir, rank: int, attempt: int) -> None:
    """The worker's half: torch's readings, added by rank 0 of the first attempt. Never raises.

    Nothing here may stop a training run: a failure is recorded in the file instead.
    """
    if rank != 0 or attempt != 0 or not run.env.exists():
        return
    try:
        from steadytune.telemetry.envsnap import torch_details

        details: dict[str, Any] = {**torch_details(), "read_by": "worker", "pid": os.getpid()}
    except Exception as exc:
        details = {"error": f"{type(exc).__name__}: {exc}", "read_by": "worker"}
    try:
        env = read_run_env(run)
        command = env.get("command")
        if isinstance(command, dict) and "interpreter" in command:
            # supervise: the trained environment is the command's; its torch was read from files only
            env = {**env, "command": {**command, "torch": {**(command.get("torch") or {}), **details}}}
        else:
            env = {**env, "torch": details}
        write_env(run, env)
    except Exception:
        pass  # env.json is a record, not a precondition


def command_python(command: Sequence[str], cwd: Path | None = None) -> str | None:
    """The Python interpreter a command runs under, when it can be told from its words.

    ``python train.py``, ``/venv/bin/python -m trl ...``, ``accelerate launch ...`` (a
    console script: its ``#!`` line names the interpreter), ``torchrun ...``. None for
    anything else (a shell script, a binary).
    """
    if not command:
        return None
    first = command[0]
    exe = first if os.sep in first else shutil.which(first)
    if exe is None and cwd is not None and (cwd / first).exists():
        exe = str(cwd / first)
    if exe is None:
        return None
    if Path(exe).name.startswith("python"):
        return exe
    try:
        with open(exe, "rb") as f:
            head = f.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if head.startswith("#!"):
        words = head[2:].split()
        if words and Path(words[0]).name == "env":
            words = [w for w in words[1:] if not w.startswith("-")]
            found = shutil.which(words[0]) if words else None
            return found if found and Path(found).name.startswith("python") else None
        if words and Path(words[0]).name.startswith("python"):
            return words[0]
    return None


def command_sources(command: Sequence[str], cwd: Path) -> list[Path]:
    """The working folder and the files a command names (``train.py``, ``config.yaml``), for git."""
    out = [cwd]
    for word in command[1:]:
        if word.startswith("-"):
            continue
        p = Path(word) if Path(word).is_absolute() else cwd / word
        if p.suffix in {".py", ".yaml", ".yml", ".json", ".toml", ".sh"} and p.is_file():
            out.append(p)
    return out


def write_command_env(run: RunDir, command: Sequence[str], cwd: Path | None = None) -> Path:
    """``env.json`` for ``steadytune supervise -- CMD``: the supervisor's environment plus the command's.

    ``command`` holds the interpreter's snapshot (torch read there, in its own process)
    when :func:`command_python` finds one, or the reason it could not.
    """
    cwd = cwd or Path.cwd()
    env = {**run_env(command_sources(command, cwd)), "written_by": "supervise"}
    python = command_python(command, cwd)
    if python is None:
        env["command"] = {
            "interpreter": None,
            "error": "the command's Python interpreter could not be told from it",
        }
    else:
        env["command"] = {**snapshot_of(python, with_torch=False), "interpreter": python}
    return write_env(run, env)

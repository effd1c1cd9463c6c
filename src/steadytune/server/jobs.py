"""How a queued job becomes a process: its command line, its environment, and the process table.

Each job is an ordinary supervised run (``steadytune run CONFIG`` or ``steadytune
supervise -- CMD``), started in a session of its own so that the daemon's death or
restart never takes it down; the daemon finds it again by its pid and start time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from steadytune.jobenv import JOB_ENV, MEMORY_CAP_ENV, SOCKET_ENV, SUBMITTED_ENV
from steadytune.rundir import ENDED_STATES, RunDir
from steadytune.server.queue import Job


def run_id(job: Job) -> str:
    """The run directory's name: the job id, then a word saying what it is."""
    label = str(job.spec.get("label") or "job")
    label = "".join(c if c.isalnum() or c in "._-" else "-" for c in label)[:40].strip("-.") or "job"
    return f"{job.id}-{label}"


def job_command(job: Job, runs_dir: Path, python: str = sys.executable) -> list[str]:
    """The ``steadytune`` command line that runs ``job`` under its supervisor."""
    spec = job.spec
    base = [python, "-m", "steadytune.cli.main"]
    rid = run_id(job)
    if spec["kind"] == "run":
        out = [*base, "run", spec["config"], *spec.get("overrides", []), f"run.runs_dir={runs_dir}"]
        out += ["--run-id", rid, "--quiet"]
        if spec.get("skip_check"):
            out.append("--skip-check")
        return out
    out = [*base, "supervise", "--runs-dir", str(runs_dir), "--run-id", rid, "--quiet"]
    if spec.get("config"):
        out += ["--config", spec["config"]]
    for item in spec.get("overrides", []):
        out += ["--set", item]
    out += list(spec.get("supervise_args", []))
    return [*out, "--", *spec["cmd"]]


def job_env(
    job: Job, gpus: tuple[int, ...], base: dict[str, str] | None = None, socket: Path | None = None
) -> dict[str, str]:
    """The job's environment: the submitter's, placed on its GPUs, with its memory cap if it has one.

    NVML numbers devices by PCI bus; CUDA, by default, fastest first. The ledger's
    indices are NVML's, so the job is told to number them the same way.
    """
    env = dict(os.environ if base is None else base)
    env.update(job.spec.get("env") or {})
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpus)
    env[JOB_ENV] = job.id
    env[SUBMITTED_ENV] = repr(job.submitted_ts)
    # The job's output goes to its log file, where Python would hold it in a block buffer: a job
    # starting for a minute would show an empty log.
    env["PYTHONUNBUFFERED"] = "1"
    if socket is not None:
        env[SOCKET_ENV] = str(socket)
    cap = job.spec.get("memory_cap_bytes")
    if cap:
        env[MEMORY_CAP_ENV] = str(int(cap))
    else:
        env.pop(MEMORY_CAP_ENV, None)
    return env


@dataclass
class Started:
    pid: int
    started: float  # the process's start time: a pid reused by another process has another
    handle: Any = None


class ProcessTable:
    """Starting, finding and signalling job processes (psutil); injectable for the daemon's tests."""

    def start(self, argv: list[str], env: dict[str, str], cwd: str, log: Path) -> Started:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own session: the daemon's end is not the job's
            )  # fmt: skip
        try:
            started = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            started = 0.0
        return Started(proc.pid, started, proc)

    def alive(self, pid: int, started: float | None) -> bool:
        try:
            p = psutil.Process(pid)
            if p.status() == psutil.STATUS_ZOMBIE:
                return False
            return started is None or abs(p.create_time() - started) < 1.0
        except psutil.Error:
            return False

    def tree(self, pid: int) -> set[int]:
        try:
            p = psutil.Process(pid)
            return {pid, *(c.pid for c in p.children(recursive=True))}
        except psutil.Error:
            return set()

    def trees(self, pids: Iterable[int]) -> dict[int, set[int]]:
        """Each pid's process tree (itself and every descendant; empty when it is gone), from one
        reading of the process table: ``tree`` reads all of ``/proc`` for each pid asked."""
        roots = set(pids)
        if not roots:
            return {}
        children: dict[int, list[int]] = {}
        for pid, ppid in _parents().items():
            children.setdefault(ppid, []).append(pid)
        out: dict[int, set[int]] = {}
        for root in roots:
            if not psutil.pid_exists(root):
                out[root] = set()
                continue
            seen, todo = {root}, [root]
            while todo:
                for child in children.get(todo.pop(), ()):
                    if child not in seen:
                        seen.add(child)
                        todo.append(child)
            out[root] = seen
        return out

    def signal(self, pid: int, sig: int, group: bool = False) -> None:
        try:
            if group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _parents() -> dict[int, int]:
    """pid → parent pid of every process: ``/proc/<pid>/stat`` read once each (psutil's ``children``
    reads them all for every call; its ``process_iter`` builds a Process for each), else psutil."""
    out: dict[int, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"]) if p.info["ppid"] is not None}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
        fields = stat[stat.rfind(b")") + 2 :].split(b" ", 2)
        if len(fields) >= 2:
            out[int(name)] = int(fields[1])
    return out


def run_status(run_dir: str | None) -> dict[str, Any]:
    """The run's ``status.json`` (its supervisor's view), or {} when it has none yet."""
    if not run_dir:
        return {}
    try:
        data = json.loads(RunDir(Path(run_dir)).status.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def ended_reason(status: Mapping[str, Any], alive: Callable[[int], bool], end: str | None = None) -> str:
    """Why a job whose supervisor is gone did not complete, from its run's last ``status.json``.

    A supervisor killed outright (SIGKILL, the kernel's OOM killer) leaves its last live state
    behind (``running``): the job did not "end running", its supervisor died, and the worker it
    started may still train, holding its memory, in no job's process tree. ``alive``: whether a
    process id runs. ``end``: the message of the event that ended the run (``run failed: the worker
    exited with code 3 ...``), which says why; the queue said only "run ended failed".
    """
    state = status.get("state")
    if not state:
        return "exited before its run wrote a status"
    if state in ENDED_STATES:
        why = end.split("\n", 1)[0].removeprefix(f"run {state}: ") if end else ""
        return f"run ended {state}: {why}" if why else f"run ended {state}"
    pid = status.get("supervisor_pid")
    who = f"its supervisor (pid {pid})" if isinstance(pid, int) else "its supervisor"
    why = f"{who} died while its run was {state} (killed, or out of memory)"
    worker = status.get("worker_pid")
    if isinstance(worker, int) and alive(worker):
        why += f"; its worker (pid {worker}) still runs: stop it (kill {worker})"
    return why

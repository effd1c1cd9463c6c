"""Starting and stopping the worker process tree (single process or torchrun).

The worker runs in its own session, so a Ctrl-C at the terminal reaches only the
supervisor, which then decides how the worker stops (checkpoint first).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

import psutil


def worker_command(run_root: Path, nproc_per_node: int = 1, python: str = sys.executable) -> list[str]:
    """The command that starts the built-in worker on ``run_root`` (a standby one adds ``--standby``)."""
    module = ["-m", "steadytune.train.worker", "--run-dir", str(run_root)]
    if nproc_per_node <= 1:
        return [python, *module]
    # torch.distributed.run is torchrun; calling it as a module keeps the supervisor torch-free.
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc_per_node}",
        "--max_restarts=0",
        *module,
    ]


def _exit_fd(pid: int) -> int | None:
    """A descriptor that turns readable when process ``pid`` ends; None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class WorkerProcess:
    """A running worker tree: its pid, its log, and ways to end it."""

    def __init__(
        self,
        cmd: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        pipe_stdout: bool = False,
        pipe_stdin: bool = False,
    ) -> None:
        self.cmd = list(cmd)
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        # How the attempt's process came to be, for its worker_started event and status.json.
        self.how = "a new process"
        self.standby = False  # a standby worker, given its orders (supervise/standby.py)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # With pipe_stdout the caller reads the output (and writes the log); otherwise it goes to the log.
        self._log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.started = time.time()
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE if pipe_stdout else self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE if pipe_stdin else subprocess.DEVNULL,
            env=self.env,
            cwd=cwd,
            start_new_session=True,
        )
        if pipe_stdout:
            self._log.close()
        self._exited = _exit_fd(self.proc.pid)
        # Closed once the exit is seen (poll), or when the object goes; a finalizer runs at most once,
        # so the number is never closed twice (it may belong to another file by then).
        self._close_exited = weakref.finalize(self, _close_quietly, self._exited) if self._exited else None

    @property
    def kind(self) -> str:
        return "standby worker" if self.standby else "new process"

    def origin(self) -> dict[str, str | bool]:
        """How the process came to be: ``how`` in words, ``standby`` whether it was the spare worker."""
        return {"how": self.how, "standby": self.standby}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        rc = self.proc.poll()
        if rc is not None and not self._log.closed:
            self._log.close()
        if rc is not None and self._close_exited is not None:
            self._close_exited()
            self._exited = self._close_exited = None
        return rc

    def wait_exit(self, timeout: float) -> None:
        """Wait ``timeout`` seconds, or less if the process ends meanwhile.

        The supervisor's loop waits here between its turns: a worker that is killed or crashes is
        noticed at once, not at the next turn. Where the system has no process file descriptor
        (Linux before 5.3, other systems) this is a plain sleep.
        """
        if self._exited is None or self.proc.returncode is not None:
            time.sleep(timeout)  # once it has ended, its descriptor stays readable: select would spin
            return
        select.select([self._exited], [], [], timeout)

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.poll() if rc is not None else None

    def tree_pids(self) -> list[int]:
        """The worker and every process under it (the root first); empty once the worker is gone."""
        found = descendants(self.pid)
        if found is not None:
            return [self.pid, *found] if found or os.path.exists(f"/proc/{self.pid}") else []
        try:
            root = psutil.Process(self.pid)
            return [self.pid, *(c.pid for c in root.children(recursive=True))]
        except psutil.Error:
            return []

    def signal_tree(self, sig: int) -> None:
        """Send ``sig`` to every process of the worker's session (torchrun and its ranks)."""
        try:
            os.killpg(self.pid, sig)
            return
        except (ProcessLookupError, PermissionError):
            pass
        for pid in self.tree_pids():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self) -> None:
        self.signal_tree(signal.SIGKILL)
        self.wait(10)

    def python_pids(self) -> list[int]:
        """The worker ranks (python processes running the worker module), for stack dumps."""
        out = []
        for pid in self.tree_pids():
            try:
                cmd = psutil.Process(pid).cmdline()
            except psutil.Error:
                continue
            if "steadytune.train.worker" in cmd and "torch.distributed.run" not in cmd:
                out.append(pid)
        return out

    def log_tail(self, max_bytes: int = 8000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


def descendants(pid: int, proc: Path = Path("/proc")) -> list[int] | None:
    """Every process under ``pid``, read from the kernel's list of each thread's children
    (``/proc/<pid>/task/<tid>/children``) of the tree's own processes; None where the kernel keeps
    no such lists (then psutil walks the whole process table).

    psutil finds a process's children by reading every process's parent: on a shared GPU server,
    hundreds of ``/proc/<pid>/stat`` files once per system sample, for a tree of a few processes.
    Both ways see a tree as it was at some moment of the reading: a process started or ended
    meanwhile may be missed, and is found by the next sample.
    """
    out: list[int] = []
    seen = {pid}
    todo = [pid]
    while todo:
        parent = todo.pop()
        tasks = proc / str(parent) / "task"
        try:
            tids = os.listdir(tasks)
        except FileNotFoundError:
            continue  # it ended
        except OSError:
            return None
        for tid in tids:
            try:
                kids = (tasks / tid / "children").read_bytes().split()
            except FileNotFoundError:
                if (tasks / tid).exists():
                    return None  # a kernel without the lists
                continue  # the thread ended
            except OSError:
                return None
            for kid in map(int, kids):
                if kid not in seen:
                    seen.add(kid)
                    out.append(kid)
                    todo.append(kid)
    return out


def running(pids: Sequence[int]) -> list[int]:
    """The pids that still run: a zombie has exited, only its parent has not yet read it."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            continue
    return out


class ProcessTree:
    """Every process the command started, remembered while it runs, so none outlives it."""

    def __init__(self, proc: WorkerProcess) -> None:
        self.proc = proc
        self.seen: set[int] = {proc.pid}

    def note(self) -> list[int]:
        """Remember every process of the tree now; returns them (the root first)."""
        now = self.proc.tree_pids()
        self.seen.update(now)
        return now

    def alive(self) -> list[int]:
        """The processes of the tree still running."""
        self.note()
        return running(sorted(self.seen))

    def reap(self, timeout: float = 10.0) -> list[int]:
        """Kill the command's process group and anything seen in its tree; the pids that were still alive."""
        import psutil

        self.note()
        alive = []
        for pid in running(sorted(self.seen - {self.proc.pid})):
            try:
                alive.append(psutil.Process(pid))
            except psutil.Error:
                continue
        self.proc.signal_tree(signal.SIGKILL)  # the session: the command and whatever stayed in it
        for p in alive:
            try:
                p.kill()  # and those that left the session (setsid) but were its children
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=timeout)
        self.proc.wait(timeout)
        return [p.pid for p in alive]

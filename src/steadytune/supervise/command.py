"""A command steadytune does not run itself (``steadytune supervise -- CMD``), as a worker source.

The command runs in its own session; its output goes to ``logs/worker-N.log`` and
through the :class:`~steadytune.supervise.log_adapter.LogAdapter` into the run's
telemetry. A restart appends the tool's resume argument (``--preset`` or
``--resume-arg``) pointing at the newest checkpoint that is whole, and after a
rollback its LR argument with the lowered rate. With ``inject`` the tool's own HF
``Trainer`` gets steadytune's guard (:mod:`steadytune.inject`), which writes the
records itself and answers control requests, as a native worker does.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from steadytune.checkpoint.external import check_external_checkpoint
from steadytune.checkpoint.manifest import list_checkpoints
from steadytune.importers import lines
from steadytune.protocol import WorkerEvent
from steadytune.records import Event, PlanRevision
from steadytune.rundir import RunDir
from steadytune.supervise.job_lr import BaseLr, choose_base_lr, lr_flag, usable_lr
from steadytune.supervise.log_adapter import LogAdapter
from steadytune.supervise.logparse import yaml_config, yaml_value
from steadytune.supervise.process import ProcessTree, WorkerProcess, running
from steadytune.supervise.ranks import read_proc
from steadytune.supervise.source import CONTROL, LR, SKIP_STEP
from steadytune.telemetry.segments import SEGMENT_ENV
from steadytune.telemetry.stream import JsonlWriter

# How each tool takes a resume checkpoint and a learning rate on its command line.
PRESETS: dict[str, dict[str, str]] = {
    # llamafactory-cli train my.yaml key=value ...: after a YAML file, overrides are key=value
    # It also resumes by itself from the newest checkpoint-N in output_dir unless told to start fresh.
    "llamafactory": {
        "resume_arg": "resume_from_checkpoint={checkpoint}",
        "lr_arg": "learning_rate={lr}",
        "fresh_arg": "overwrite_output_dir=true",
        "output_key": "output_dir",
        "settings_yaml": "yes",
    },
    # trl sft / HF example scripts (also under accelerate launch): HfArgumentParser flags
    "trl": {
        "resume_arg": "--resume_from_checkpoint {checkpoint}",
        "lr_arg": "--learning_rate {lr}",
        "output_key": "output_dir",
    },
    "hf": {
        "resume_arg": "--resume_from_checkpoint {checkpoint}",
        "lr_arg": "--learning_rate {lr}",
        "output_key": "output_dir",
    },
    # axolotl train my.yml --key=value: every config key is also a --dashed-flag after the YAML. With
    # auto_resume_from_checkpoints in its YAML it resumes by itself from the newest checkpoint-N in
    # output_dir, whole or not (axolotl.utils.train.determine_last_checkpoint); an explicit
    # resume_from_checkpoint wins over it, and a restart from the start turns it off.
    "axolotl": {
        "resume_arg": "--resume-from-checkpoint={checkpoint}",
        "lr_arg": "--learning-rate={lr}",
        "fresh_arg": "--no-auto-resume-from-checkpoints",
        "output_key": "output_dir",
        "settings_yaml": "yes",
    },
    # swift sft|pt|rlhf: HfArgumentParser flags. It resumes only when told (or from a flash
    # checkpoint's own tracker, use_flash_ckpt); the resume reads the checkpoint's args.json for the
    # model and template, never its learning rate.
    "swift": {
        "resume_arg": "--resume_from_checkpoint {checkpoint}",
        "lr_arg": "--learning_rate {lr}",
        "output_key": "output_dir",
    },
}
# output_key: the tool's output-folder argument (--output_dir, --output-dir, output_dir=), where its
# checkpoint-N folders go without --output-dir. settings_yaml: the tool takes its settings from the YAML
# config the command names, under the keys its overrides use (see command_setting).
_FALSE = frozenset({"false", "0", "no", "n", "f"})


def flag_spellings(key: str) -> tuple[str, ...]:
    """``--learning_rate`` and ``--learning-rate``: HfArgumentParser takes both."""
    return (f"--{key}", f"--{key.replace('_', '-')}")


def flag_value(cmd: Sequence[str], key: str) -> str | None:
    """The last value the command gives ``key``: ``--key V``, ``--key=V`` or (LLaMA-Factory) ``key=V``."""
    found = None
    flags = flag_spellings(key)
    for i, word in enumerate(cmd):
        if word in flags and i + 1 < len(cmd):
            found = cmd[i + 1]
        for prefix in (*(f + "=" for f in flags), f"{key}="):
            if word.startswith(prefix):
                found = word[len(prefix) :]
    return found


def command_lr(command: Sequence[str], lr_arg: str | None) -> tuple[float, str] | None:
    """The LR the command gives itself where ``lr_arg`` would set it, with that argument's name."""
    flag = lr_flag(lr_arg)
    if flag is None:
        return None
    value = flag_value(command, flag.lstrip("-").replace("-", "_"))
    try:
        lr = float(value) if value is not None else None
    except ValueError:
        return None
    return (lr, flag) if usable_lr(lr) else None


def command_setting(preset: str | None, command: Sequence[str], key: str) -> tuple[str, str] | None:
    """The value the job gives its setting ``key`` and where it says so: the last ``--key V`` (or
    ``key=V``) on its command line, else, where the preset's tool takes a YAML config (llamafactory,
    axolotl), ``key:`` in the YAML the command names. None when it says nothing of it.
    """
    value = flag_value(command, key)
    if value is not None:
        return value, "the command"
    if PRESETS.get(preset or "", {}).get("settings_yaml"):
        value = yaml_value(command, key)
        if value is not None:
            return value, str(yaml_config(command))
    return None


def output_dir_of(preset: str | None, command: Sequence[str]) -> Path | None:
    """The job's output folder as its command says it, where the preset knows the tool's argument:
    ``--output_dir X`` (or ``output_dir=X``), else ``output_dir:`` in its YAML config."""
    key = PRESETS.get(preset or "", {}).get("output_key")
    found = command_setting(preset, command, key) if key else None
    return Path(found[0]) if found and found[0] else None


def checkpoint_folder(
    preset: str | None, output_dir: Path | None, command: Sequence[str]
) -> tuple[Path | None, str]:
    """Where the job's checkpoint-N folders are looked for (``--output-dir``, else the command's own
    output folder), and what the user is told of it ("" when they gave it)."""
    if output_dir is not None:
        return output_dir, ""
    found = output_dir_of(preset, command)
    if found is not None:
        return found, f"steadytune: checkpoints are looked for in {found}, the job's own output folder"
    why = f" and the command names no output folder that --preset {preset} reads" if preset else ""
    return None, (
        f"warning: no --output-dir{why}: steadytune cannot see the job's checkpoint-N folders, so a "
        "restart (after a crash, a hang or a rollback) begins again from step 0. Give --output-dir the "
        "folder the job saves its checkpoints in"
    )


def preset_problems(preset: str | None, command: Sequence[str]) -> list[str]:
    """What the command must say for ``preset`` to resume it and does not, each with its fix."""
    if preset != "swift":
        return []
    version = flag_value(command, "add_version")
    if version is not None and version.strip().lower() in _FALSE:
        return []
    got = "not given (default true)" if version is None else f"--add_version {version}"
    return [
        f"ms-swift writes each start into a new folder under its --output_dir (v0-<time>, then v1-<time>, "
        f"...; add_version is {got}), so a restart would not find the checkpoints of the attempt before it. "
        "Fix: add --add_version false to the swift command, with supervise --output-dir the same folder "
        "as its --output_dir"
    ]


# The optimizer's and scheduler's state in an HF checkpoint: a rollback at a lower LR leaves them out.
_TRAINING_STATE = frozenset({"optimizer.pt", "scheduler.pt", "optimizer.bin", "scheduler.bin"})
# What the injected guard prints when it could not attach (see steadytune.inject).
INJECT_FAILED = "steadytune: guard not injected"


def deepest_first(parents: dict[int, int]) -> list[list[int]]:
    """The processes of a tree in layers, the deepest first (``parents``: pid -> parent pid).

    A launcher (``trl``, ``accelerate launch``, ``llamafactory-cli``) copies its trainer's stderr
    into the log: aborted first, it dies before it has passed on the trainer's stacks, and the
    dump holds the launcher's frames only. So each layer is aborted once the one below it is gone.
    """

    def depth(pid: int) -> int:
        n, seen = 0, {pid}
        while parents.get(pid) in parents and parents[pid] not in seen:
            pid = parents[pid]
            seen.add(pid)
            n += 1
        return n

    layers: dict[int, list[int]] = {}
    for pid in parents:
        layers.setdefault(depth(pid), []).append(pid)
    return [sorted(layers[d]) for d in sorted(layers, reverse=True)]


def _send(pids: Sequence[int], *signals: int) -> None:
    for pid in pids:
        for sig in signals:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _dump(group: Sequence[int], log: Path, deadline: float) -> str:
    """What ``group`` printed to the log on SIGABRT, once each has exited (or the deadline passed)."""
    start = _size(log)
    _send(group, signal.SIGCONT, signal.SIGABRT)
    # Until each has printed and exited: a dead child stays a zombie until it is reaped, and
    # pid_exists counts it, which held every dump for the whole 5 s.
    while time.monotonic() < deadline and running(group):
        time.sleep(0.1)
    # The output reaches the log through a pipe (and a launcher that copies it): until it stops growing.
    settle = time.monotonic() + 1.0
    size = _size(log)
    while time.monotonic() < settle:
        time.sleep(0.2)
        if (now := _size(log)) == size:
            break
        size = now
    try:
        with open(log, "rb") as f:
            f.seek(start)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@dataclass
class CommandOptions:
    command: Sequence[str]
    output_dir: Path | None = None
    resume_arg: str | None = None  # e.g. "--resume_from_checkpoint {checkpoint}"
    lr_arg: str | None = None  # e.g. "--learning_rate {lr}": how a rollback lowers the job's LR
    # appended on a restart from the start, for a tool that would resume by itself
    fresh_arg: str | None = None
    base_lr: float | None = None  # --base-lr: the LR a rollback scales, said by the user
    config_lr: float | None = None  # the config's train.learning_rate: the job's LR only if it logs none
    inject: bool = False  # give the tool's HF Trainer the guard (records, NaN skip, control)
    segment_bytes: int = 0  # run.telemetry_segment_bytes: rank-0's rotation, by whichever of us writes it


class CommandSource:
    """Starts, reads and resumes an arbitrary training command."""

    label = "job"

    def __init__(self, opts: CommandOptions, run: RunDir, clock: Callable[[], float] = time.time) -> None:
        self.opts, self.run = opts, run
        self.checkpoint_root = opts.output_dir
        self.writer = JsonlWriter(run.telemetry(0), opts.segment_bytes)
        self.adapter = LogAdapter(self.writer, opts.command, opts.output_dir, clock)
        self.injected = opts.inject
        self._reader: threading.Thread | None = None
        self._job_lr: float | None = None  # the highest LR logged by attempts at the job's own LR
        self._at_own_lr = True  # this attempt was given no lowered LR

    @property
    def abilities(self) -> frozenset[str]:
        out = {LR} if self.opts.lr_arg and self.base_lr() else set()
        if self.injected:
            out |= {CONTROL, SKIP_STEP}
        return frozenset(out)

    # -- starting ---------------------------------------------------------------
    def base_lr(self) -> BaseLr | None:
        """The LR a rollback scales (:func:`~steadytune.supervise.job_lr.choose_base_lr`).

        Only an attempt that ran at the job's own LR counts as logging it: one given a lowered
        LR logs that, which a second rollback would lower again.
        """
        peak = self.adapter.peak_lr
        if self._at_own_lr and peak is not None:
            self._job_lr = peak if self._job_lr is None else max(self._job_lr, peak)
        given = command_lr(self.opts.command, self.opts.lr_arg)
        return choose_base_lr(self.opts.base_lr, given, self._job_lr, self.opts.config_lr)

    def command_for(self, plan: PlanRevision) -> list[str]:
        cmd = list(self.opts.command)
        if plan.resume_checkpoint and self.opts.resume_arg:
            cmd += [p.replace("{checkpoint}", plan.resume_checkpoint) for p in self.opts.resume_arg.split()]
        elif plan.attempt > 0 and self.opts.fresh_arg:
            cmd += self.opts.fresh_arg.split()
        cmd += self._lr_args(plan)[0]
        return cmd

    def _lr_args(self, plan: PlanRevision) -> tuple[list[str], str]:
        """The LR argument of a rollback's attempt, and what it says of the LR chosen ("" if none)."""
        scale = plan.lr_scale if plan.lr_scale is not None else 1.0
        base = self.base_lr()
        if scale == 1.0 or base is None or not self.opts.lr_arg:
            return [], ""
        lr = base.lr * scale
        # The job's schedule scales the given LR as it scaled its own: a step runs at x{scale} of the
        # LR it ran at before.
        said = f"the job restarts at base LR {lr:.6g}: x{scale:g} of {base.said()} ({base.lr:g})"
        if base.note:
            said += f"; {base.note}"
        return [p.replace("{lr}", f"{lr:.6g}") for p in self.opts.lr_arg.split()], said

    def start(self, plan: PlanRevision, log_path: Path) -> WorkerProcess:
        # PYTHONFAULTHANDLER: a Python trainer prints every thread's stack on SIGABRT, which is
        # how a hung one shows where it hangs.
        env = {"STEADYTUNE_ATTEMPT": str(plan.attempt), "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
        env[SEGMENT_ENV] = str(self.opts.segment_bytes)  # an injected guard rotates the stream as we do
        if self.opts.inject:
            from steadytune.inject import inject_env

            env.update(inject_env(self.run.root, plan.attempt, {**os.environ, **env}))
        self.injected = self.opts.inject
        self.adapter.records = not self.injected
        resume = Path(plan.resume_checkpoint) if plan.resume_checkpoint else None
        cmd = self.command_for(plan)  # before the adapter forgets the LR the last attempt logged
        lr_args, said = self._lr_args(plan)
        self._at_own_lr = self._at_own_lr and not lr_args
        self.adapter.begin(plan.attempt, resume)
        if said:
            self.writer.write(
                Event(ts=self.adapter.clock(), kind="lifecycle", name=WorkerEvent.ROLLBACK_LR, message=said)
            )
        proc = WorkerProcess(cmd, log_path, env=env, pipe_stdout=True)
        # Run again as given: a tool that resumes from its own output folder goes on from there (the
        # first step says so: Resumes.on_first_step).
        proc.how = "a new process: the supervised command is run again as given each attempt"
        self._reader = threading.Thread(target=self._pipe, args=(proc,), daemon=True)
        self._reader.start()
        return proc

    def _pipe(self, proc: WorkerProcess) -> None:
        out = proc.proc.stdout
        assert out is not None
        limit = lines.MAX_LINE_CHARS
        with open(proc.log_path, "ab") as log:
            overlong = False  # inside a line longer than any record: kept in the log, not read
            while raw := out.readline(limit):
                log.write(raw)
                log.flush()
                ended = raw.endswith(b"\n")
                if overlong or (not ended and len(raw) >= limit):
                    # Held whole, a job's line without an end (a binary dump, a progress bar never
                    # ended) would take the supervisor's memory with it: read past, chunk by chunk.
                    overlong = not ended
                    continue
                line = raw.decode("utf-8", "replace")
                if self.injected and line.startswith(INJECT_FAILED):
                    self._inject_failed(line.strip())
                self.adapter.on_stdout(line)

    def _inject_failed(self, line: str) -> None:
        """The guard could not attach: the log adapter takes over, with what that loses."""
        self.injected = False
        self.adapter.records = True
        self.writer.write(
            Event(
                ts=time.time(),
                kind="lifecycle",
                name=WorkerEvent.INJECT_FAILED,
                message=f"{line}; progress is read from the job's log instead (no NaN skip before the "
                "update, no batch fingerprints, no control requests)",
                severity="warning",
            )
        )

    def poll(self) -> None:
        self.adapter.poll_files()

    def settle(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)
        self.adapter.poll_files()
        self.adapter.drain()

    def training(self) -> None:
        return None  # nothing to get ready: each attempt runs the command anew

    def close(self) -> None:
        return None

    def standby_pid(self) -> int | None:
        return None

    # -- checkpoints --------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        return list_checkpoints(self.opts.output_dir) if self.opts.output_dir else []

    def problem(self, checkpoint: Path) -> str | None:
        ok, reason = check_external_checkpoint(checkpoint)
        return None if ok else reason

    def resume_copy(self, checkpoint: Path) -> Path:
        """The checkpoint a rollback at a lower LR resumes: without the optimizer's and scheduler's state.

        Their saved state carries the LR that diverged, and the HF Trainer loads it over the
        lowered one. The injected guard keeps the new LR itself; without it, the rollback
        resumes a copy (hard links: no weights are copied) that leaves them out, so the
        optimizer and the schedule start afresh at the lowered rate.
        """
        if self.injected:
            return checkpoint
        dest = self.run.root / "rollback" / checkpoint.name
        if dest.exists():
            shutil.rmtree(dest)
        for src in checkpoint.rglob("*"):
            rel = src.relative_to(checkpoint)
            if rel.parts[0] in _TRAINING_STATE or src.is_dir():
                continue
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, out)
            except OSError:
                shutil.copy2(src, out)
        return dest

    def latest_checkpoint(self) -> str | None:
        found = self.checkpoints()
        return found[0].name if found else None

    def steps_are_real(self) -> bool:
        return self.injected or self.adapter.steps_are_real()

    def describe(self) -> str:
        return " ".join(self.opts.command)

    def write_env(self, sources: list[Path]) -> None:
        """The supervisor's environment and the command's interpreter's (read before the command starts)."""
        from steadytune.telemetry.runenv import write_command_env

        write_command_env(self.run, self.opts.command)

    # -- stacks -------------------------------------------------------------------
    def dump_stacks(self, tree: ProcessTree, proc: WorkerProcess, out: Path) -> list[int]:
        """The Python stacks of a hung command, into ``out``, before it is killed; each headed by its
        pid and rank (``RANK``/``LOCAL_RANK`` of its environment) and whether it was stopped.

        Every Python process of the tree gets SIGCONT (a stopped one cannot answer) and then
        SIGABRT, on which faulthandler (enabled by PYTHONFAULTHANDLER) prints all threads; the
        deepest first, each layer once the one below it has exited (see :func:`deepest_first`).
        The ranks answer one at a time, so each dump is known to be its own; meanwhile the
        processes above them are held stopped, or torch elastic, seeing one rank end, would end
        the others before they had printed.
        """
        import psutil

        tree.note()
        pids = []
        parents: dict[int, int] = {}
        for pid in sorted(tree.seen):
            try:
                p = psutil.Process(pid)
                # A console script (llamafactory-cli, trl) is named after itself; its interpreter is python.
                if "python" in Path(p.exe()).name.lower() or "python" in p.name().lower():
                    pids.append(pid)
                    parents[pid] = p.ppid()
            except (psutil.Error, OSError):
                continue
        procs = {pid: read_proc(pid) for pid in pids}
        ranked = [pid for pid in pids if procs[pid].rank is not None]
        held = {parents[pid] for pid in ranked if parents.get(pid) in parents} if len(ranked) > 1 else set()
        _send(sorted(held), signal.SIGSTOP)
        # Five seconds for the dumps, and one more for each rank answering alone.
        deadline = time.monotonic() + 5.0 + len(ranked)
        sections = []
        for layer in deepest_first(parents):
            alone = [[pid] for pid in layer if pid in ranked]
            rest = [pid for pid in layer if pid not in ranked]
            for group in [*alone, *([rest] if rest else [])]:
                text = _dump(group, proc.log_path, deadline)
                if "Fatal Python error" in text or 'File "' in text:
                    sections.append(f"=== {'; '.join(procs[pid].label() for pid in group)} ===\n{text}")
        if not sections:
            return []
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(sections))
        return pids

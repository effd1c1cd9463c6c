"""``steadytune run CONFIG.yaml [key=value ...]``: a supervised fine-tune."""

from __future__ import annotations

import argparse
import math
import os
import shlex
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, add_overrides
from steadytune.config import ConfigError, load_config
from steadytune.config.schema import SteadytuneConfig
from steadytune.rundir import RunDir


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "run",
        "fine-tune a model under supervision",
        "steadytune run examples/lora.yaml train.max_steps=100 train.learning_rate=1e-4",
        description="Fine-tune a Hugging Face causal LM (full, LoRA or QLoRA) under a supervisor that "
        "watches it, "
        "checkpoints it safely and restarts it from the newest verified checkpoint when it dies. "
        "The preflight runs first; the first attempt's worker imports its libraries meanwhile and "
        "trains only after a GO (recover.standby_worker: false starts it after the check).",
    )
    p.add_argument("config", type=Path, help="the YAML config (see examples/)")
    add_overrides(p)
    p.add_argument("--run-id", help="name of the run directory (default: <model>-<date>-<time>-<xxxx>)")
    add_launch_options(p)
    # The preflight (docs/preflight.md) runs before every `run`.
    p.add_argument("--skip-check", action="store_true", help="start without the preflight check")
    p.add_argument("--force", action="store_true", help="start even when the preflight says no-go")
    p.set_defaults(func=main)


def add_launch_options(p: argparse.ArgumentParser) -> None:
    """Options shared by `run` and `demo`."""
    p.add_argument("--quiet", action="store_true", help="no live progress line")
    p.add_argument(
        "--dashboard",
        action="store_true",
        help="serve the live dashboard while the run goes (URL printed at start)",
    )
    p.add_argument("--host", default=None, help="dashboard address (default 127.0.0.1; others need a token)")
    p.add_argument("--port", type=int, default=None, help="dashboard port (default 7860; 0 picks a free one)")
    p.add_argument(
        "--policy",
        choices=["act", "observe"],
        default=None,
        help="observe: detect and alert, but take no automatic action",
    )
    p.add_argument(
        "--safe-mode",
        action="store_true",
        help="first run on new data or a new model: clipping, NaN guard, time-bounded checkpoints, "
        "rollback on the first confirmed spike, LR sanity check (docs/recovery.md)",
    )


def goodput_lines(run: RunDir, save_steps: int | None, max_steps: int | None = None) -> list[str]:
    """The run's goodput line, and the checkpoint-interval advice when its interval loses more than it
    would at the optimum (docs/goodput.md)."""
    from steadytune.goodput.advice import advise
    from steadytune.goodput.load import run_account
    from steadytune.goodput.text import summary_line

    acct = run_account(run)
    lines = [summary_line(acct)]
    if save_steps:
        advice = advise(
            acct.save_cost_s, acct.step_s, acct.interruptions, acct.exposure_s, save_steps, max_steps
        )
        if advice is not None and advice.worth_saying:
            lines.append(f"checkpoints: {advice.line()}")
    return lines


def undelivered_alert_lines(events: list[Any]) -> list[str]:
    """One line per alert sink that missed alerts in the run, with how many and its last error.

    An alert a sink could not take is recorded in ``events.jsonl`` (``data.undelivered``) and shown
    on the events timeline, but the console said nothing of it: a webhook with a wrong URL or a
    relay refusing the login went unnoticed until the page that never came.
    """
    missed: dict[str, list[str]] = {}
    sent = 0
    for ev in events:
        if ev.kind != "alert" or not isinstance(ev.data, dict):
            continue
        sent += 1
        undelivered = ev.data.get("undelivered")
        for sink, error in undelivered.items() if isinstance(undelivered, dict) else ():
            missed.setdefault(str(sink), []).append(str(error).removeprefix(f"{sink}: "))
    return [f"alerts: {sink} missed {len(errors)} of {sent}: {errors[-1]}" for sink, errors in missed.items()]


def loss_change(first: float | None, last: float | None) -> str:
    """The summary's loss row: first → last, and how much lower where a share of it means something.

    A share needs a loss bounded below by 0 that started clearly above it (a cross-entropy). An RL or
    preference objective (a GRPO loss that starts at 0 and goes negative) has none: its 1e-7 → -0.24
    read "230137129% lower".
    """
    if first is None or last is None:
        return "-"
    said = f"{first:.4f} → {last:.4f}"
    if first >= 1e-3 and 0 <= last <= first:
        return f"{said} ({100 * (1 - last / first):.0f}% lower)"
    return said


def print_summary(console: Any, result: Any, cfg: SteadytuneConfig | None = None) -> None:
    from steadytune.telemetry.progress import human_seconds

    p = result.progress
    rows = [
        ("state", f"{result.state} — {result.reason}"),
        ("steps", f"{p.step}" + (f"/{p.max_steps}" if p.max_steps else "")),
        ("loss first → last", loss_change(p.first_loss, p.last_loss)),
        ("eval loss", f"{p.last_eval_loss:.4f}" if p.last_eval_loss is not None else "-"),
        ("tokens/s", f"{p.tokens_per_s:,.0f}" if p.tokens_per_s else "-"),
        ("skipped updates", str(p.skipped_steps)),
        ("checkpoints", ", ".join(result.checkpoints) or "none"),
        ("restarts", str(result.restarts)),
        ("wall time", human_seconds(result.wall_s)),
        ("run directory", str(result.run.root)),
    ]
    width = max(len(k) for k, _ in rows)
    console.print("")
    for k, v in rows:
        console.print(f"  {k:<{width}}  {v}", highlight=False, markup=False)
    save_steps = cfg.train.save_steps if cfg is not None else None
    for line in goodput_lines(result.run, save_steps, p.max_steps):
        console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
    from steadytune.telemetry.events import read_events

    for line in undelivered_alert_lines(read_events(result.run.events)):
        console.print(f"  {line}", style="yellow", highlight=False, markup=False, soft_wrap=True)
    rd = result.run.root
    console.print("\nnext:", highlight=False)
    # Each line whole, however long its paths, and quoted for a shell: they are copied and pasted.
    q = shlex.quote
    nexts = [
        # replay, not analyze: it shows what the supervisor raised live, a rolled-back attempt's included.
        f"  steadytune replay {q(str(rd))}   # anomalies raised live (rolled-back attempts' too), actions",
        f"  cat {q(str(rd / 'events.jsonl'))}   # what happened, in order",
        # A --dashboard started with the run stops with it; this one serves every run, finished ones too.
        f"  steadytune dashboard {q(str(rd.parent))}   # every run's charts and events",
    ]
    if result.state in {"stopped", "failed"} and cfg is not None:
        # A watched command (cfg None) is started again by its own command line, not by steadytune.
        nexts.insert(0, f"  steadytune resume {q(str(rd))}   # go on from the newest verified checkpoint")
    for line in nexts:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    final = rd / "final"
    if final.exists():
        console.print(f"  the trained model/adapter is in {final}", markup=False, soft_wrap=True)


def launch(
    cfg: SteadytuneConfig,
    run_id: str | None = None,
    quiet: bool = False,
    worker_env: dict[str, str] | None = None,
    args: argparse.Namespace | None = None,
    source: Any = None,
    stop_grace_s: float | None = None,
    early: Any = None,
    preflight: tuple[float, float] | None = None,
    resume_after: str | None = None,
) -> int:
    """Create the run directory and supervise the job to its end. Shared by ``run``, ``demo`` and
    ``supervise``.

    ``source`` (a :class:`~steadytune.supervise.source.WorkerSource` factory taking the RunDir)
    replaces steadytune's own worker with, e.g., a command it watches. A run stopped by a
    signal exits 0 under ``run`` (its state is saved), and 128 + the signal under a command's
    supervisor, as the command itself would have; a stop or pause asked for otherwise exits 0.
    ``early`` (a :class:`~steadytune.supervise.standby.Standby`) is the first attempt's worker process,
    started while the preflight ran; it is stopped here if the run does not take it. ``preflight`` is
    when the check before it began and ended (the goodput account counts it apart from start-up).
    ``resume_after`` (stopped, failed, crashed): the run directory ``run_id`` exists, and its run,
    which ended so, goes on from its newest verified checkpoint (``steadytune resume``).
    """
    try:
        return _launch(
            cfg, run_id, quiet, worker_env, args, source, stop_grace_s, early, preflight, resume_after
        )
    finally:
        if early is not None:
            early.stop()


def _launch(
    cfg: SteadytuneConfig,
    run_id: str | None,
    quiet: bool,
    worker_env: dict[str, str] | None,
    args: argparse.Namespace | None,
    source: Any,
    stop_grace_s: float | None,
    early: Any,
    preflight: tuple[float, float] | None = None,
    resume_after: str | None = None,
) -> int:
    from steadytune.cli._common import console as make_console
    from steadytune.supervise.supervisor import Supervisor, new_run_id

    console = make_console(stderr=False, highlight=False, soft_wrap=True)
    rid = run_id or new_run_id(cfg, time.time())
    run = RunDir(Path(cfg.run.runs_dir) / rid)
    if resume_after is None and (run.root / "events.jsonl").exists():
        console.print(f"error: run directory {run.root} already exists; pick another --run-id", style="red")
        return 2
    from steadytune.alerts.sinks import secret_problem

    unread = secret_problem(cfg.alerts)
    if unread is not None:  # before the run folder exists: the router would fail in the supervisor
        console.print(f"error: {unread.render()}", style="red", markup=False, highlight=False)
        return 2
    watching_a_command = source is not None  # its exit codes are the command's (below)
    if source is None and cfg.run.engine == "ray":
        import importlib.util

        from steadytune.supervise.ray_source import RaySource
        from steadytune.supervise.source import run_worker_env

        # found without importing it: the supervisor stays Ray-free
        if importlib.util.find_spec("ray") is None:
            console.print(
                "error: run.engine: ray needs Ray Train here and on every node: pip install "
                "'steadytune[ray]'",
                style="red",
            )
            return 2
        # Every Ray worker is told the rotation size as a native one is (the driver passes STEADYTUNE_*).
        ray_env = run_worker_env(cfg, worker_env)
        source = lambda run: RaySource(run, env=ray_env)  # noqa: E731
    extra: dict[str, Any] = {} if stop_grace_s is None else {"stop_grace_s": stop_grace_s}
    if early is not None:
        extra["early"] = early
    sup = Supervisor(
        cfg,
        run,
        console=console,
        worker_env=worker_env,
        source=source(run) if source else None,
        launch=launch_marks(preflight),
        **extra,
    )
    where = "resumed in" if resume_after else "→"
    console.print(f"run {rid} {where} {run.root}", highlight=False, markup=False)
    dashboard = None
    if (args is not None and getattr(args, "dashboard", False)) or cfg.dashboard.enabled:
        dashboard = start_dashboard_for(cfg, args, console)
        if dashboard is None:
            return 2
        sup.books.dashboard_url = cfg.dashboard.public_url or dashboard.url  # what alerts link to
    previous = {s: signal.signal(s, sup.controls.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if quiet or not console.is_terminal:
            result = sup.run_to_end(
                live=PlainProgress(console) if not quiet else None, resume_after=resume_after
            )
        else:
            from rich.live import Live

            with Live("", console=console, refresh_per_second=4, transient=True) as live:
                result = sup.run_to_end(live=live, resume_after=resume_after)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if dashboard is not None:
            dashboard.stop()
    # A watched command's checkpoint interval is its own, not the config's: no advice on it.
    print_summary(console, result, None if watching_a_command else cfg)
    if watching_a_command and result.state == "stopped" and sup.state.stop.signal is not None:
        return 128 + sup.state.stop.signal
    return 0 if result.state in {"completed", "stopped", "paused"} else 1


def launch_marks(
    preflight: tuple[float, float] | None = None, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """When this run was asked for, before its supervisor began: ``run_started``'s ``data.launch``.

    ``launched_ts`` is this process's start (the CLI's own imports are start-up too); a job the
    GPU server started also has its submission (the queue wait) and its id.
    """
    from steadytune.cli.main import STARTED_TS
    from steadytune.jobenv import JOB_ENV, SUBMITTED_ENV

    env = os.environ if env is None else env
    started = STARTED_TS
    marks: dict[str, Any] = {"launched_ts": started}
    if preflight is not None:
        marks["preflight"] = [preflight[0], preflight[1]]
    try:
        submitted = float(env.get(SUBMITTED_ENV, ""))
    except ValueError:
        submitted = None
    if submitted is not None and submitted <= started:
        marks.update(submitted_ts=submitted, job=env.get(JOB_ENV))
    return marks


def start_dashboard_for(cfg: SteadytuneConfig, args: argparse.Namespace | None, console: Any) -> Any:
    """Start the in-process dashboard over the runs folder; None (and a reason) if it may not start."""
    from steadytune.web.security import BindRefused
    from steadytune.web.server import start_dashboard

    host = (getattr(args, "host", None) if args else None) or cfg.dashboard.host
    port = getattr(args, "port", None) if args else None
    port = cfg.dashboard.port if port is None else port
    token = dashboard_token(cfg)
    try:
        d = cfg.dashboard
        handle = start_dashboard(
            Path(cfg.run.runs_dir),
            host=host,
            port=port,
            token=token,
            public_url=d.public_url,
            request_timeout_s=d.request_timeout_s,
            max_connections=d.max_connections,
            max_streams=d.max_streams,
        )
    except BindRefused as exc:
        console.print(f"error: {exc}", style="red", markup=False)
        return None
    except OSError as exc:
        console.print(
            f"error: cannot serve the dashboard on {host}:{port}: {exc}; pick another --port",
            style="red",
            markup=False,
        )
        return None
    console.print(f"dashboard: {handle.url}", highlight=False, markup=False)
    return handle


def dashboard_token(cfg: SteadytuneConfig) -> str | None:
    from steadytune.web.security import resolve_token

    return resolve_token(None, cfg.dashboard.token_env, cfg.dashboard.token_file)


def apply_modes(cfg: SteadytuneConfig, args: argparse.Namespace) -> SteadytuneConfig:
    """--policy observe and --safe-mode, applied on top of the config file."""
    from steadytune.config.safe_mode import check_lr, safe_mode

    if getattr(args, "safe_mode", False):
        cfg = safe_mode(cfg)
    if getattr(args, "policy", None):
        cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"mode": args.policy})})
    check_lr(cfg)
    return cfg


class PlainProgress:
    """Progress for logs and pipes: one line every 10 s instead of a redrawn line.

    A line the same as the last one printed is not printed again: while a job loads, or a restarted
    one resumes, the line stands still, and a log filled with "step 0 | loss - | ..." every 10 s says
    nothing the first one did not.
    """

    def __init__(self, console: Any, every_s: float = 10.0, clock: Any = time.monotonic) -> None:
        self.console, self.every_s, self.clock = console, every_s, clock
        self._last, self._said = -math.inf, ""

    def update(self, line: str) -> None:
        now = self.clock()
        if now - self._last >= self.every_s and line != self._said:
            self._last, self._said = now, line
            self.console.print(line, highlight=False, markup=False)


def main(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    try:
        cfg = apply_modes(cfg, args)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    run_id, early = args.run_id, None
    if not args.skip_check:  # preflight: a no-go stops here unless --force
        from steadytune.preflight.gate import preflight_gate
        from steadytune.supervise.source import discard_early, early_standby
        from steadytune.supervise.supervisor import new_run_id

        # The first attempt's worker imports torch and transformers while the check runs; it is
        # sent into the attempt only after a GO (supervise/standby.py).
        run_id = run_id or new_run_id(cfg, time.time())
        early = early_standby(cfg, RunDir(Path(cfg.run.runs_dir) / run_id))
        checked = time.time()
        try:
            code = preflight_gate(args.config, args.overrides, force=args.force)
        except BaseException:  # a Ctrl-C during the check: nothing of the run may stay behind
            code = 130
            raise
        finally:
            if code is not None and early is not None:
                discard_early(early)
        if code is not None:
            return code
        preflight = (checked, time.time())
    else:
        preflight = None
    return launch(cfg, run_id=run_id, quiet=args.quiet, args=args, early=early, preflight=preflight)

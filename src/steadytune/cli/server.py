"""``steadytune server``: the GPU server daemon (queue, ledger, memory-aware admission)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, fail

EXAMPLE = """steadytune server --runs-dir /data/runs --gpus 0,1,2,3
  steadytune server --dashboard --port 7860        # with the server page at /server
  steadytune server --snapshot-file gpus.json      # no GPU here: read the GPUs from a JSON file"""

DESCRIPTION = """\
One daemon per host. Jobs sent with `steadytune submit` wait in a durable queue
(SQLite in --dir) and start only where their estimated peak memory fits:
free − reserved − headroom ≥ need on every GPU they get. Each job is an ordinary
supervised run under --runs-dir, in a session of its own: stopping or killing the
server leaves the jobs running, and the next server adopts them. A job with scale: asks
the server for GPUs before it grows and gives them back when it shrinks. When a GPU's free
memory falls below --pressure-gib, its lowest-priority job is checkpointed and paused (or
shrunk off it) and resumes when room returns. See docs/server.md."""


def register(sub: Any) -> None:
    p = add_command(
        sub, "server", "run the GPU server: a job queue with memory-aware admission", EXAMPLE, DESCRIPTION
    )
    p.add_argument("--dir", type=Path, default=None, help="the server's folder: queue, socket, job logs "
                   "(default $STEADYTUNE_SERVER_DIR or ~/.local/state/steadytune/server)")  # fmt: skip
    p.add_argument("--socket", type=Path, default=None, help="the API socket (default DIR/server.sock)")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where job runs go (default ./runs)")
    p.add_argument(
        "--gpus", default=None, help="the GPU indices (NVML order) it manages, e.g. 0,1 (default all)"
    )
    p.add_argument("--headroom-gib", type=float, default=1.0, help="memory kept spare per GPU (default 1)")
    p.add_argument("--pressure-gib", type=float, default=None,
                   help="a GPU with less free than this is under memory pressure: its lowest-priority job is "
                   "paused or shrunk (default: the headroom; 0 turns it off)")  # fmt: skip
    p.add_argument("--interval", type=float, default=1.0, help="seconds between passes (default 1)")
    p.add_argument(
        "--snapshot-file",
        type=Path,
        default=None,
        help="read the GPUs from this JSON file at each pass instead of NVML (docs/server.md)",
    )
    p.add_argument("--dashboard", action="store_true", help="also serve the dashboard, with the server page")
    p.add_argument("--host", default="127.0.0.1", help="dashboard address (others need a token)")
    p.add_argument("--port", type=int, default=7860, help="dashboard port (0 picks a free one)")
    p.set_defaults(func=main)


def parse_gpus(text: str | None) -> set[int] | None:
    if not text:
        return None
    try:
        out = {int(t) for t in text.split(",") if t.strip()}
    except ValueError:
        raise ValueError(f"--gpus {text!r}: give NVML indices separated by commas, e.g. --gpus 0,1") from None
    if any(i < 0 for i in out):
        raise ValueError(f"--gpus {text!r}: indices are ≥ 0")
    return out


def main(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    from steadytune.server.api import SocketApi
    from steadytune.server.daemon import Daemon, ServerPaths, default_dir
    from steadytune.server.gpus import only
    from steadytune.server.ledger import GIB
    from steadytune.server.queue import JobQueue

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    gpus, source, problems = _gpus_and_source(args)
    if problems:
        return fail("; ".join(problems), 2)
    root = (args.dir or default_dir()).resolve()
    paths = ServerPaths(root=root, runs_dir=args.runs_dir.resolve())
    paths.runs_dir.mkdir(parents=True, exist_ok=True)
    sock = (args.socket or paths.socket).resolve()
    if len(str(sock)) > 100:
        return fail(
            f"socket path {sock} is too long for a Unix socket (100 characters at most); pass a shorter "
            f"--socket",
            2,
        )
    from steadytune.secretfile import InsecureDirectory

    try:
        queue = JobQueue(paths.queue)
    except InsecureDirectory as exc:
        return fail(str(exc), 2)
    for note in queue.notes:
        print(f"steadytune server: {note}", flush=True)
    daemon = Daemon(
        queue,
        paths,
        only(source, gpus),
        headroom_bytes=int(args.headroom_gib * GIB),
        socket=sock,
        pressure_bytes=None if args.pressure_gib is None else int(args.pressure_gib * GIB),
    )
    try:
        api = SocketApi(daemon, sock)
    except OSError as exc:
        return fail(str(exc), 1)
    dashboard = None
    if args.dashboard:
        dashboard = _start_dashboard(args, paths.runs_dir, daemon)
        if dashboard is None:
            api.stop()
            return 2
    stopping = stop or threading.Event()
    if stop is None:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, lambda *_: stopping.set())
    print(f"steadytune server: socket {sock}, queue {paths.queue}, runs {paths.runs_dir}", flush=True)
    try:
        daemon.serve(stopping, args.interval)
    finally:
        api.stop()
        if dashboard is not None:
            dashboard.stop()
        daemon.queue.close()
    print("server stopped; running jobs keep running and the next server adopts them", flush=True)
    return 0


def _gpus_and_source(args: argparse.Namespace) -> tuple[set[int] | None, Any, list[str]]:
    """The GPUs to manage and where their readings come from, and every problem with the options."""
    from steadytune.server.gpus import NvmlSource, SnapshotFileSource

    problems = []
    gpus = None
    try:
        gpus = parse_gpus(args.gpus)
    except ValueError as exc:
        problems.append(str(exc))
    if not args.headroom_gib >= 0:
        problems.append(f"--headroom-gib {args.headroom_gib}: give GiB ≥ 0 (default 1)")
    if args.pressure_gib is not None and not args.pressure_gib >= 0:
        problems.append(f"--pressure-gib {args.pressure_gib}: give GiB ≥ 0 (default: the headroom; 0: off)")
    source: Any = None
    if args.snapshot_file is not None:
        try:
            source = SnapshotFileSource(args.snapshot_file)
        except ValueError as exc:
            problems.append(str(exc))
    else:
        source = NvmlSource()
        if not source.available:
            problems.append(
                "NVML is not available (no NVIDIA driver, or `pip install nvidia-ml-py`); "
                "without a GPU, --snapshot-file FILE reads the GPUs from a JSON file"
            )
    return gpus, source, problems


def _start_dashboard(args: argparse.Namespace, runs_dir: Path, daemon: Any) -> Any:
    from steadytune.web.security import BindRefused, resolve_token
    from steadytune.web.server import start_dashboard

    try:
        handle = start_dashboard(runs_dir, host=args.host, port=args.port, token=resolve_token(None),
                                 server=daemon)  # fmt: skip
    except BindRefused as exc:
        fail(str(exc), 2)
        return None
    except OSError as exc:
        fail(f"cannot serve the dashboard on {args.host}:{args.port}: {exc}; pick another --port", 2)
        return None
    print(f"dashboard: {handle.url}server", flush=True)
    return handle

"""``steadytune top``: a live terminal view of the GPUs and the runs on this machine."""

from __future__ import annotations

import argparse
import contextlib
import select
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command


def register(sub: Any) -> None:
    p = add_command(
        sub, "top", "live view of the GPUs and the runs on this machine", "steadytune top runs/ --interval 2"
    )
    p.add_argument("runs_dir", nargs="?", default="runs", type=Path, help="runs directory (default: ./runs)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default: 1)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.set_defaults(func=run)


@contextlib.contextmanager
def _cbreak() -> Iterator[bool]:
    """Single-key input without Enter when stdin is a terminal; restores it on exit."""
    if not sys.stdin.isatty():
        yield False
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def _quit_pressed(timeout: float, keys: bool) -> bool:
    if not keys:
        time.sleep(timeout)
        return False
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    return bool(ready) and sys.stdin.read(1).lower() == "q"


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from steadytune.web.topview import frame, read_gpus, scan_runs

    console = Console()
    render = lambda: frame(read_gpus(), scan_runs(args.runs_dir), args.runs_dir)  # noqa: E731
    if args.once:
        console.print(render())
        return 0
    try:
        with _cbreak() as keys, Live(render(), console=console, screen=False, auto_refresh=False) as live:
            while not _quit_pressed(max(0.1, args.interval), keys):
                live.update(render(), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0

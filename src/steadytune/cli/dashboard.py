"""``steadytune dashboard``: serve the web dashboard and /metrics for a runs directory."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, fail

EXAMPLE = """steadytune dashboard runs/ --port 7860
  STEADYTUNE_DASHBOARD_TOKEN=... steadytune dashboard runs/ --host 0.0.0.0   # other machines need a token"""


def register(sub: Any) -> None:
    p = add_command(sub, "dashboard", "serve the live web dashboard and /metrics", EXAMPLE)
    p.add_argument("runs_dir", nargs="?", default="runs", type=Path, help="runs directory (default: ./runs)")
    p.add_argument(
        "--host", default="127.0.0.1", help="bind address (default 127.0.0.1; others need a token)"
    )
    p.add_argument("--port", type=int, default=7860, help="port (default 7860; 0 picks a free one)")
    p.add_argument(
        "--public-url",
        default=None,
        help="the URL it is reached at behind a reverse proxy (its Host is accepted; reads then need the "
        "token)",
    )
    p.add_argument(
        "--metrics-keep-finished-hours", type=float, default=24.0, metavar="H",
        help="/metrics carries a finished run's series for H hours after its end, then only counts it in "
        "steadytune_runs (default 24; inf: always). Runs this dashboard never read are read in the "
        "background, newest first: their series appear once read (steadytune_runs_pending_index)",
    )  # fmt: skip
    p.add_argument(
        "--token", default=None,
        help="operator token (prefer env STEADYTUNE_DASHBOARD_TOKEN: a flag shows in `ps`)",
    )  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    from pydantic import ValidationError

    from steadytune.config.dashboard import DashboardConfig
    from steadytune.web.security import BindRefused, resolve_token
    from steadytune.web.server import start_dashboard

    if not args.runs_dir.is_dir():
        return fail(f"runs directory {args.runs_dir} does not exist; pass the folder that holds your runs", 2)
    try:
        token = resolve_token(args.token)
        public_url = getattr(args, "public_url", None)
        if public_url:
            DashboardConfig(public_url=public_url)  # the same check as in a config file
        keep_h = getattr(args, "metrics_keep_finished_hours", 24.0)
        if not keep_h >= 0:
            return fail(f"--metrics-keep-finished-hours {keep_h}: give hours >= 0 (inf: always)", 2)
        handle = start_dashboard(
            args.runs_dir, host=args.host, port=args.port, token=token, public_url=public_url,
            metrics_keep_finished_s=keep_h * 3600.0,
        )  # fmt: skip
    except BindRefused as exc:
        return fail(str(exc), 2)
    except ValidationError as exc:
        return fail(f"--public-url: {exc.errors()[0]['msg']}", 2)
    except OSError as exc:
        return fail(f"cannot listen on {args.host}:{args.port}: {exc.strerror}; pick another --port", 1)
    try:  # from here on the handle is stopped however the command ends (its cache folder removed)
        controls = "on (token set)" if token else "off (read-only; set STEADYTUNE_DASHBOARD_TOKEN to enable)"
        if handle.app.exposed:
            controls += "; reads need the token too (reachable from other machines)"
        url = handle.url
        print(f"steadytune dashboard: {url}   metrics: {url}metrics   operator controls: {controls}")
        print("Ctrl-C to stop", flush=True)
        (stop or threading.Event()).wait()
    except KeyboardInterrupt:
        pass
    finally:
        handle.stop()
    return 0

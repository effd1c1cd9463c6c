"""The preflight as ``steadytune run`` performs it: in a child process, then go / no-go.

The check loads the tokenizer (and with it torch) to scan the data; the process that
calls this becomes the supervisor, which must never hold torch (it has to outlive CUDA
failures). So the check runs as ``steadytune check --format json`` in a child, and only
its JSON answer comes back here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from steadytune.preflight.render import print_report
from steadytune.preflight.result import from_json


def preflight_gate(
    config: Path, overrides: list[str], force: bool = False, console: Any = None
) -> int | None:
    """Run the preflight for ``run``; None means start the run, an int is the exit code to stop with.

    Args:
        config: the config file, as given to ``run``.
        overrides: the ``key=value`` overrides, as given to ``run``.
        force: start despite a no-go (the findings are still shown).
        console: a rich console (a new one when None).
    """
    if console is None:
        from rich.console import Console

        console = Console(highlight=False)
    cmd = [sys.executable, "-m", "steadytune.cli.main", "check", str(config), *overrides, "--format", "json"]
    cmd.append("--reuse-scan")  # the scan's answer only changes with its inputs: pay for it once
    env = {**os.environ, "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        report = from_json(data) if "checks" in data else None
    except (ValueError, IndexError):
        report = None
    if report is None:
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        console.print(
            f"preflight could not run (exit {proc.returncode}):\n{tail}", markup=False, highlight=False
        )
        if force:
            console.print("starting anyway (--force)", style="yellow")
            return None
        console.print(
            "the run was not started; pass --skip-check to start without the preflight", style="red"
        )
        return 1
    print_report(report, console, only_problems=True)
    if report.go:
        return None
    if force:
        console.print("no-go overridden by --force: starting anyway", style="yellow")
        return None
    console.print(
        f"the run was not started: fix the ✗ above (details: steadytune check {config}), or pass --force "
        "to start anyway",
        style="red",
        markup=False,
        highlight=False,
    )
    return 1

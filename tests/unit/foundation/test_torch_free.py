"""The supervisor side never imports torch: it must outlive CUDA failures and start fast."""

from __future__ import annotations

import subprocess
import sys

TORCH_FREE = [
    "steadytune.records",
    "steadytune.config",
    "steadytune.telemetry.store",
    "steadytune.telemetry.events",
    "steadytune.telemetry.sampler",
    "steadytune.detect.live",
    "steadytune.policy.engine",
    "steadytune.policy.plan",
    "steadytune.supervise.supervisor",
    "steadytune.supervise.external",
    "steadytune.alerts.router",
    "steadytune.web.server",
    "steadytune.checkpoint.store",
    "steadytune.estimate",
    "steadytune.cli.main",
]


def test_supervisor_side_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in TORCH_FREE)
        + "from steadytune.cli.main import build_parser\nbuild_parser()\n"
        + "heavy = sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules)\n"
        + "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"imported: {out.stdout.strip()}"

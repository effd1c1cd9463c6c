"""Run code in a fresh interpreter and report what it imported.

Checking ``sys.modules`` inside the pytest process proves nothing once any other
test has imported torch: the module is there either way. A new interpreter starts
clean, so what it holds at the end is what the code under test imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What the supervisor side must never load: torch and what pulls it in, and datasets (pyarrow, pandas).
HEAVY = ("torch", "transformers", "peft", "accelerate", "datasets")

# A name mapped to None is one the code hid from the import system (train/lean.py), not one it imported.
_REPORT = (
    "\nimport json as _j, sys as _s\n"
    "print('@@MODULES ' + _j.dumps(sorted(k for k, v in _s.modules.items() if v is not None)))\n"
)


def fresh_imports(code: str, watch: tuple[str, ...] = HEAVY, timeout: float = 120) -> list[str]:
    """Which of ``watch`` are imported after ``code`` ran in a new interpreter (it must succeed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    out = subprocess.run(
        [sys.executable, "-c", code + _REPORT], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert out.returncode == 0, f"the code failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    line = next(x for x in reversed(out.stdout.splitlines()) if x.startswith("@@MODULES "))
    modules = set(json.loads(line.removeprefix("@@MODULES ")))
    return sorted(m for m in watch if m in modules)

"""Has the environment changed since this config last trained to the end?

``check`` compares this interpreter's packages (the ones ``run`` would train with),
its Python and the GPU driver against ``env.json`` of the newest *completed* run of
the same config in the runs folder. "The same config" is the same ``run.name`` when
the config sets one, else the same resolved config (sha256 of its ``config.yaml``).
A change is a warning that names each package, never a failure: upgrading on
purpose is normal, and the new run records its own environment. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from steadytune.config.load import dump_config
from steadytune.config.schema import SteadytuneConfig
from steadytune.config.yamlsafe import load_yaml
from steadytune.forensics.envdiff import EnvDiff, diff_envs
from steadytune.preflight.result import Check, na, ok, warn
from steadytune.rundir import RunDir
from steadytune.telemetry.runenv import EnvError, read_run_env, run_env

# What a preflight can read without torch; the rest of env.json is the worker's.
COMPARED = ("python", "driver")
SHOWN = 8  # packages named in the reason; the data holds all of them


def config_hash(config_text: str) -> str:
    return hashlib.sha256(config_text.encode("utf-8")).hexdigest()


def _run_name(config_text: str) -> str | None:
    try:
        data = load_yaml(config_text) or {}
    except yaml.YAMLError:
        return None
    name = (data.get("run") or {}).get("name") if isinstance(data, dict) else None
    return str(name) if name else None


def _state(run: RunDir) -> tuple[str | None, float]:
    try:
        status = json.loads(run.status.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, 0.0
    if not isinstance(status, dict):
        return None, 0.0
    return status.get("state"), float(status.get("updated_ts") or 0.0)


def last_completed_run(runs_dir: Path, name: str | None, digest: str) -> RunDir | None:
    """The newest completed run under ``runs_dir`` of the config named ``name`` (or hashed ``digest``)."""
    if not runs_dir.is_dir():
        return None
    best: tuple[float, RunDir] | None = None
    for root in runs_dir.iterdir():
        run = RunDir(root)
        if not run.env.is_file() or not run.config.is_file():
            continue
        state, when = _state(run)
        if state != "completed":
            continue
        if same_config(run, name, digest) and (best is None or when > best[0]):
            best = (when, run)
    return best[1] if best else None


def same_config(run: RunDir, name: str | None, digest: str) -> bool:
    """Whether ``run`` trained the config named ``name`` (or, without a name, the one hashed ``digest``)."""
    try:
        text = run.config.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False  # a run this user may not read is no baseline
    return _run_name(text) == name if name else config_hash(text) == digest


def describe(d: EnvDiff, limit: int = SHOWN) -> str:
    """The changed packages in one line: ``transformers 5.24.0 → 5.25.0, +trl 1.16.0, -peft 0.21.2``."""
    parts = [f"{n} {a} → {b}" for n, (a, b) in d.changed.items()]
    parts += [f"+{n} {v}" for n, v in d.added.items()]
    parts += [f"-{n} {v}" for n, v in d.removed.items()]
    parts += [f"{label} {a} → {b}" for label, (a, b) in d.runtime.items() if label in COMPARED]
    more = f" and {len(parts) - limit} more" if len(parts) > limit else ""
    return ", ".join(parts[:limit]) + more


def environment_check(cfg: SteadytuneConfig, current: Callable[[], dict[str, Any]] = run_env) -> Check:
    """``versions``/``environment``: ok, a warning naming what changed, or na without a previous run.

    Args:
        cfg: the validated config (its ``run.runs_dir`` is searched).
        current: this interpreter's environment (``run_env``; injected in tests).
    """
    runs_dir = Path(cfg.run.runs_dir)
    prev = last_completed_run(runs_dir, cfg.run.name, config_hash(dump_config(cfg)))
    if prev is None:
        return na("versions", "environment", f"no completed run of this config in {runs_dir} to compare with")
    try:
        before = read_run_env(prev)
    except EnvError as exc:
        return na("versions", "environment", str(exc))
    now = current()
    d = diff_envs(before, now)
    runtime = {k: v for k, v in d.runtime.items() if k in COMPARED}
    if not (d.added or d.removed or d.changed or runtime):
        return ok(
            "versions",
            "environment",
            f"same packages as {prev.run_id}, the last completed run of this config",
        )
    n = len(d.package_names())
    return warn(
        "versions",
        "environment",
        f"{n} package{'s' if n != 1 else ''} differ from {prev.run_id}, the last completed run of this "
        f"config: " + describe(EnvDiff(d.added, d.removed, d.changed, runtime)),
        f"if the change was not meant, restore it: steadytune env export {prev.root} -o requirements.txt && "
        "pip install -r requirements.txt; if it was, go ahead (the new run records its own env.json)",
        run=prev.run_id,
        added=d.added,
        removed=d.removed,
        changed={k: list(v) for k, v in d.changed.items()},
        runtime={k: list(v) for k, v in runtime.items()},
    )

"""The environment that injects the guard into a child process (a tool's trainer).

Stdlib only: the supervisor (torch-free) calls :func:`inject_env`, and the child,
which may run in a virtualenv without steadytune's dependencies, imports this package.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

RUN_ENV = "STEADYTUNE_INJECT_RUN"  # the run directory root; its presence switches injection on
ATTEMPT_ENV = "STEADYTUNE_ATTEMPT"  # the (re)start number, written into every record
SWITCH_ENV = "STEADYTUNE_INJECT"  # "off" (or 0/false/no) disables injection even when RUN_ENV is set
STARTUP_DIR = Path(__file__).resolve().parent / "startup"  # holds the sitecustomize.py the child runs
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the steadytune package itself

_METADATA = (".dist-info", ".egg-info", ".egg-link", ".pth")


def package_root(run_root: Path, package_dir: Path = PACKAGE_DIR) -> Path:
    """A folder to put on the child's ``PYTHONPATH`` from which ``import steadytune`` works.

    In a source checkout that is the folder above the package (``src/``). When steadytune is
    installed into a ``site-packages`` that holds other packages (torch, transformers...), that
    folder would shadow the tool's own: a folder in the run directory holding only a link to
    the package is used instead.
    """
    parent = package_dir.parent
    others = [
        p.name
        for p in parent.iterdir()
        if p.name not in {package_dir.name, "__pycache__"} and not p.name.endswith(_METADATA)
    ]
    if not others:
        return parent
    shim = Path(run_root) / "inject" / "lib"
    shim.mkdir(parents=True, exist_ok=True)
    link = shim / package_dir.name
    if not (link.is_symlink() and link.resolve() == package_dir.resolve()):
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(package_dir, target_is_directory=True)
    return shim


def inject_env(
    run_root: Path, attempt: int, env: Mapping[str, str], package_dir: Path = PACKAGE_DIR
) -> dict[str, str]:
    """Environment additions that give the child's HF ``Trainer`` the guard.

    Args:
        run_root: the run directory (``runs/<id>``); the guard writes ``telemetry/rank-N.jsonl`` there.
        attempt: the (re)start number of the child.
        env: the environment the child would get otherwise (its ``PYTHONPATH`` is kept, after ours).
        package_dir: the steadytune package to import in the child (injected for tests).

    Returns:
        ``PYTHONPATH``, ``STEADYTUNE_INJECT_RUN`` and ``STEADYTUNE_ATTEMPT``, to update ``env`` with.
    """
    ours = [str(STARTUP_DIR), str(package_root(run_root, package_dir))]
    theirs = env.get("PYTHONPATH")
    kept = [p for p in theirs.split(os.pathsep) if p not in ours] if theirs else []
    return {
        "PYTHONPATH": os.pathsep.join(ours + kept),
        RUN_ENV: str(Path(run_root).resolve()),
        ATTEMPT_ENV: str(int(attempt)),
    }
